"""Transports the model's iWARP stack runs over: the kernel's TCP through asyncio sockets, an
in-memory pair for tests, and a raw-frame endpoint with its own Ethernet/ARP/IPv4/TCP."""
