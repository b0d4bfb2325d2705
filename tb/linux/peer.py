"""Linux's side of the TCP tests (tb/linux/test_linux_tcp.py), run inside the test's network
namespace with the project's Python: plain sockets, so the peer is the kernel's TCP.

Each connection sends a pattern of ``--size`` bytes, reads until the NIC's FIN, then closes;
the pattern and the key of each result are the connection's *client* port (the NIC learns it
from its ESTABLISHED event), so both sides agree on which bytes belong where. At the end one
JSON object goes to stdout: ``{client_port: {"received": n, "sha256": hex}}``.
"""

import argparse
import hashlib
import json
import random
import socket
import struct
import threading


def pattern(seed, port, size, side):
    """The bytes ``side`` ("linux" or "nic") sends on the connection whose client port is
    ``port``."""
    return random.Random(f"{seed}:{port}:{side}").randbytes(size)


def run_connection(sock, client_port, args, results):
    data = pattern(args.seed, client_port, args.size, "linux")

    def send():
        sock.sendall(data)
        if not args.abort:
            sock.shutdown(socket.SHUT_WR)

    sender = threading.Thread(target=send)
    sender.start()
    digest, received = hashlib.sha256(), 0
    # With --abort, stop after the NIC's pattern (the NIC does not close) and reset.
    while (not args.abort or received < args.size) and (chunk := sock.recv(1 << 16)):
        digest.update(chunk)
        received += len(chunk)
    sender.join()
    if args.abort:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()
    results[client_port] = {"received": received, "sha256": digest.hexdigest()}


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("mode", choices=["server", "client"])
    parser.add_argument("--host", default="")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--conns", type=int, default=1)
    parser.add_argument("--size", type=int, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--abort", action="store_true",
                        help="once the NIC's bytes are in, reset the connection (SO_LINGER 0)")
    args = parser.parse_args()
    results, threads = {}, []
    if args.mode == "server":
        with socket.create_server((args.host, args.port), backlog=args.conns) as server:
            print(json.dumps({"listening": args.port}), flush=True)
            for _ in range(args.conns):
                sock, (_, client_port) = server.accept()
                threads.append(threading.Thread(target=run_connection,
                                                args=(sock, client_port, args, results)))
                threads[-1].start()
    else:
        for _ in range(args.conns):
            sock = socket.create_connection((args.host, args.port), timeout=300)
            sock.settimeout(None)
            client_port = sock.getsockname()[1]
            threads.append(threading.Thread(target=run_connection,
                                            args=(sock, client_port, args, results)))
            threads[-1].start()
    for thread in threads:
        thread.join()
    print(json.dumps({str(k): v for k, v in results.items()}), flush=True)


if __name__ == "__main__":
    main()
