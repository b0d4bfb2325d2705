"""Applications on the host side of the TCP engine (:mod:`iwarp_nic.tcp`): small clients of its
command, event and byte-stream ports that make a node do something on its own.

* :mod:`.echo`: :class:`~.echo.TcpEcho`, an echo server (RFC 862 over TCP) on one port, and
  :class:`~.echo.EchoNode`, a TCP node running it.
* :mod:`.target`: :class:`~.target.TargetPlan`, what the host of a memory target board (a
  NicCore with block RAM for host memory and no CPU) writes into the NIC's registers and its
  RAM to register memory, accept connections and serve rping: the plan its gateware follows.
* :mod:`.target_host`: :class:`~.target_host.TargetHost`, that gateware (a state machine
  with the plan's programs in a ROM), and :class:`~.target_host.MemoryTarget`, a NicCore with
  block RAM for host memory and that host: a board's memory target without the board.
"""

from .echo import EchoNode, TcpEcho

__all__ = ["EchoNode", "TcpEcho"]
