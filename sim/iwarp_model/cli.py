"""The model's command line, over the kernel's TCP (:mod:`.transport.sockets`):

``python -m iwarp_model serve --port P [--crc] [--markers] [--mpa-rev 1|2]``
    Serve perf clients, any number, each connection on its own device and QP. The client's MPA
    Request carries its :class:`~.apps.PerfRequest`; the Reply carries the server's buffer, or
    the server rejects with a reason (see :mod:`.apps`).

``python -m iwarp_model connect HOST --port P --op write|read|send|atomic --size N --iters K``
``[--crc] [--markers] [--mpa-rev 1|2]``
    Run one perf test and print an ib_write_bw-style table.

``python -m iwarp_model rping --server|--client HOST --port P [--count N] [--size S]``
``[--verbose] [--crc] [--mpa-rev 1|2]``
    rping's exchange (:class:`~.apps.RpingServer`, :class:`~.apps.RpingClient`) with IRD =
    ORD = 1; the client validates every ping. ``--server`` serves one client, as rping -s.

Every mode takes ``--pcap FILE`` (the servers write one file per connection: ``dir/run.pcap``
gives ``dir/run-<client ip>-<client port>.pcap``). Errors are one line on stderr with
an exit code: 1 the test failed (a completion error, a data mismatch), 2 bad arguments,
3 no TCP connection (refused, unreachable), 4 the MPA Request was rejected, 5 a Terminate was
received or sent, 6 the connection closed early.
"""

import argparse
import asyncio
import os
import sys

from . import apps
from .engine import Connection
from .transport import sockets

__all__ = ["main", "EXIT_FAILED", "EXIT_USAGE", "EXIT_NO_CONNECTION", "EXIT_REJECTED",
           "EXIT_TERMINATE", "EXIT_CLOSED"]

EXIT_FAILED, EXIT_USAGE, EXIT_NO_CONNECTION = 1, 2, 3
EXIT_REJECTED, EXIT_TERMINATE, EXIT_CLOSED = 4, 5, 6
PERF_DEPTH = 16


def _options(parser: argparse.ArgumentParser, *, markers: bool = True) -> None:
    parser.add_argument("--port", "-p", type=int, required=True)
    parser.add_argument("--crc", action="store_true", help="ask for MPA CRCs")
    if markers:
        parser.add_argument("--markers", action="store_true", help="ask for MPA markers")
    parser.add_argument("--mpa-rev", type=int, choices=(1, 2), default=2)
    parser.add_argument("--pcap", metavar="FILE", help="record the connection(s) to a pcap")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m iwarp_model",
                                     description="The iWARP reference model as a peer.")
    modes = parser.add_subparsers(dest="mode", required=True)
    serve = modes.add_parser("serve", help="serve perf clients")
    _options(serve)
    serve.add_argument("--bind", default="0.0.0.0", help="address to listen on")
    connect = modes.add_parser("connect", help="run a perf test against a server")
    connect.add_argument("host")
    _options(connect)
    connect.add_argument("--op", choices=apps.OPS, required=True)
    connect.add_argument("--size", type=int, required=True)
    connect.add_argument("--iters", type=int, required=True)
    rping = modes.add_parser("rping", help="rping client or server")
    role = rping.add_mutually_exclusive_group(required=True)
    role.add_argument("--server", action="store_true")
    role.add_argument("--client", metavar="HOST")
    _options(rping, markers=False)
    rping.add_argument("--bind", default="0.0.0.0", help="server: address to listen on")
    rping.add_argument("--count", "-C", type=int, default=0, help="pings (0: forever)")
    rping.add_argument("--size", "-S", type=int, default=apps.RPING_DEFAULT_SIZE)
    rping.add_argument("--verbose", "-v", action="store_true")
    return parser


def _connection(qp, args, *, active: bool, **options) -> Connection:
    return Connection(qp, active=active, revision=args.mpa_rev, crc=args.crc,
                      markers=getattr(args, "markers", False), **options)


def _capture(args) -> dict:
    """serve()'s capture options for ``--pcap FILE``: FILE's directory and name as prefix."""
    if not args.pcap:
        return {}
    root = os.path.splitext(os.path.abspath(args.pcap))[0]
    return {"capture_dir": os.path.dirname(root),
            "capture_prefix": os.path.basename(root) + "-"}


async def _run_client(link: sockets.SocketLink, run):
    """Await ``run()`` on the established ``link``; close it in any case. A connection that
    ended under the application raises the link's own error (Terminate, closed)."""
    try:
        await link.established()
        try:
            return await run()
        except apps.Disconnected:
            raise sockets.link_error(link.conn) from None
    finally:
        link.close()
        await link.closed()


async def _serve(args) -> int:
    servers: dict[int, apps.PerfServer] = {}

    def make_connection() -> Connection:
        host = apps.Host("iwarp-serve", send_wr=64, recv_wr=apps.MAX_SEND_ITERS + 1)
        server = apps.PerfServer(host)
        conn = _connection(host.qp, args, active=False, auto_accept=False)
        conn.on_request = server.on_request
        servers[id(conn)] = server
        return conn

    async def handler(link: sockets.SocketLink) -> None:
        server = servers.pop(id(link.conn))
        peer = f"{link.peer[0]}:{link.peer[1]}"
        try:
            await link.established()
            received = await server.run()
            request = server.request
            extra = f", {received} messages received" if request.op == "send" else ""
            print(f"{peer}: {request.op} {request.size} B x {request.iters} done{extra}",
                  flush=True)
        except (sockets.LinkError, apps.AppError) as error:
            print(f"{peer}: {error}", file=sys.stderr, flush=True)

    server = await sockets.serve(args.bind, args.port, make_connection, handler,
                                 **_capture(args))
    port = server.sockets[0].getsockname()[1]
    print(f"listening on {args.bind}:{port}", flush=True)
    async with server:
        await server.serve_forever()
    return 0


async def _connect(args) -> int:
    request = apps.PerfRequest(args.op, args.size, args.iters)
    host = apps.Host("iwarp-connect", send_wr=PERF_DEPTH + 2)
    client = apps.PerfClient(host, request, depth=PERF_DEPTH)
    conn = _connection(host.qp, args, active=True, private_data=client.private_data)
    link = await sockets.connect(args.host, args.port, conn, capture=args.pcap)
    result = await _run_client(
        link, lambda: client.run(apps.BufferInfo.decode(conn.peer_private_data)))
    print(apps.perf_table(result), flush=True)
    return 0


async def _rping(args) -> int:
    host = apps.Host("iwarp-rping", ird=1, ord=1, send_wr=16, recv_wr=2, cqe=32)
    if args.client:
        client = apps.RpingClient(host, size=args.size, count=args.count, verbose=args.verbose)
        link = await sockets.connect(args.client, args.port, _connection(host.qp, args,
                                                                         active=True),
                                     capture=args.pcap)
        await _run_client(link, client.run)
        return 0
    server = apps.RpingServer(host, size=args.size, verbose=args.verbose)
    done: asyncio.Future = asyncio.get_running_loop().create_future()

    async def handler(link: sockets.SocketLink) -> None:
        try:
            await link.established()
            await server.run()
        except Exception as error:  # reported by main(), not by the event loop
            if not done.done():
                done.set_exception(error)
        if not done.done():
            done.set_result(None)

    connections = iter([_connection(host.qp, args, active=False)])

    def make_connection() -> Connection:
        conn = next(connections, None)
        if conn is None:  # rping -s serves one client; a second is refused with a reject
            spare = apps.Host("iwarp-rping-busy")
            conn = _connection(spare.qp, args, active=False)
            conn.on_request = lambda c: c.reject(b"rping server busy")
        return conn

    listener = await sockets.serve(args.bind, args.port, make_connection, handler,
                                   **_capture(args))
    print(f"listening on {args.bind}:{listener.sockets[0].getsockname()[1]}", flush=True)
    try:
        await done
    finally:
        listener.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit code."""
    args = _parser().parse_args(argv)
    mode = {"serve": _serve, "connect": _connect, "rping": _rping}[args.mode]
    target = getattr(args, "host", None) or getattr(args, "client", None)
    try:
        if args.mode == "rping" and not (apps.RPING_MIN_SIZE <= args.size
                                         <= apps.RPING_MAX_SIZE):
            raise ValueError(f"Invalid size {args.size} (valid range is "
                             f"{apps.RPING_MIN_SIZE} to {apps.RPING_MAX_SIZE})")
        return asyncio.run(mode(args))
    except KeyboardInterrupt:
        return 130
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_USAGE
    except ConnectionRefusedError:
        print(f"error: connection refused by {target}:{args.port}", file=sys.stderr)
        return EXIT_NO_CONNECTION
    except sockets.MpaRejected as error:
        print(f"error: MPA Request rejected: {error.reason.decode('utf-8', 'replace')}",
              file=sys.stderr)
        return EXIT_REJECTED
    except (sockets.TerminateReceived, sockets.TerminateSent) as error:
        t = error.terminate
        print(f"error: Terminate {t.layer}/{t.etype}/{t.ecode:#04x}: {error}", file=sys.stderr)
        return EXIT_TERMINATE
    except sockets.ConnectionClosed as error:
        print(f"error: connection closed: {error}", file=sys.stderr)
        return EXIT_CLOSED
    except OSError as error:
        print(f"error: cannot connect to {target}:{args.port}: {error.strerror or error}",
              file=sys.stderr)
        return EXIT_NO_CONNECTION
    except apps.AppError as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_FAILED
