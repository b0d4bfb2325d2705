"""The applications model to model over real sockets on 127.0.0.1: rping (count 10, validated,
its data pattern checked against rping.c's rule), ucmatose both sides, and the perf test's
client and server for every operation, with the data checked by hash."""

import asyncio
import hashlib

import pytest

from iwarp_model import apps
from iwarp_model.engine import Connection
from iwarp_model.transport import sockets


def run(coro):
    asyncio.run(asyncio.wait_for(coro, 60))


async def connect_pair(server_conn, client_conn, server_app, client_app):
    """Serve ``server_conn`` on a free port, connect ``client_conn``, run both apps; returns
    their results."""
    result = asyncio.get_running_loop().create_future()

    async def handler(link):
        await link.established()
        try:
            result.set_result(await server_app(link))
        except Exception as error:
            result.set_exception(error)

    server = await sockets.serve("127.0.0.1", 0, lambda: server_conn, handler)
    port = server.sockets[0].getsockname()[1]
    link = await sockets.connect("127.0.0.1", port, client_conn)
    await link.established()
    client_result = await client_app(link)
    server_result = await result
    await asyncio.wait_for(link.closed(), 10)
    server.close()
    await server.wait_closed()
    return server_result, client_result


def test_rping_pattern_follows_rping_c():
    buf = apps.rping_pattern(0, 64)
    assert buf.startswith(b"rdma-ping-0: ABCDEFGHIJ") and buf[-1] == 0 and len(buf) == 64
    assert apps.rping_pattern(1, 40)[13:16] == b"BCD"
    # the letters run A..z and wrap to A; the start letter moves on one per ping, mod 58
    assert apps.rping_pattern(57, 200)[14:17] == b"zAB"
    assert apps.rping_pattern(58, 64)[14:15] == b"A"
    assert apps.rping_pattern(123, 26) == b"rdma-ping-123: " + bytes(range(72, 82)) + b"\0"


@pytest.mark.parametrize("crc", [False, True])
def test_rping_client_and_server(crc):
    async def main():
        client_host = apps.Host("c", ird=1, ord=1, send_wr=16, recv_wr=2, cqe=32)
        server_host = apps.Host("s", ird=1, ord=1, send_wr=16, recv_wr=2, cqe=32)
        lines = []
        client = apps.RpingClient(client_host, size=100, count=10, verbose=True,
                                  out=lines.append)
        server = apps.RpingServer(server_host, size=100, verbose=True, out=lines.append)

        async def run_client(link):
            pings = await client.run()
            link.close()
            return pings

        async def run_server(link):
            return await server.run()

        served, pinged = await connect_pair(
            Connection(server_host.qp, active=False, crc=crc),
            Connection(client_host.qp, active=True, crc=crc), run_server, run_client)
        assert served == pinged == 10
        pings = [line for line in lines if line.startswith("ping data: ")]
        assert pings == [f"ping data: {apps.rping_pattern(i, 100)[:99].decode()}"
                         for i in range(10)]
        assert sum(line.startswith("server ping data: ") for line in lines) == 10
        assert client_host.qp.max_rd_atomic == 1

    run(main())


def test_rping_client_larger_than_server_fails_like_rping():
    async def main():
        client_host, server_host = apps.Host("c", ird=1, ord=1), apps.Host("s", ird=1, ord=1)
        client = apps.RpingClient(client_host, size=200, count=1)
        server = apps.RpingServer(server_host, size=64)

        async def run_client(link):
            with pytest.raises(apps.Disconnected):
                await client.run()
            return "failed"

        with pytest.raises(apps.CompletionError) as info:
            await connect_pair(Connection(server_host.qp, active=False),
                               Connection(client_host.qp, active=True),
                               lambda link: server.run(), run_client)
        assert info.value.wc.status.name == "LOC_PROT_ERR"

    run(main())


def test_ucmatose_both_sides():
    async def main():
        def side(name, fill):
            host = apps.Host(name, send_wr=10, recv_wr=10, separate_cqs=True, sq_sig_all=True)
            return host, apps.Ucmatose(host, data=bytes([fill]) * 100)

        server_host, server = side("s", 0x53)
        client_host, client = side("c", 0x43)

        async def run_server(link):
            await server.run_server()
            link.close()
            return len(server.received)

        async def run_client(link):
            await client.run_client()
            await link.closed()  # cmatose's client waits for the server's disconnect
            return len(client.received)

        # The server sends first: the peer-to-peer RTR of RFC 6581 lets it (module doc).
        counts = await connect_pair(Connection(server_host.qp, active=False, p2p=True),
                                    Connection(client_host.qp, active=True, p2p=True),
                                    run_server, run_client)
        assert counts == (10, 10)
        # cmatose sends from and receives into one buffer: the client echoes the server's data
        assert bytes(client.buffer.memory) == bytes(server.buffer.memory) == b"S" * 100

    run(main())


@pytest.mark.parametrize("op,size,iters", [("write", 65536, 40), ("read", 65536, 40),
                                           ("send", 4096, 200), ("atomic", 8, 50),
                                           ("write", 0, 5), ("send", 0, 5)])
def test_perf_client_and_server(op, size, iters):
    async def main():
        server_host = apps.Host("s", recv_wr=apps.MAX_SEND_ITERS + 1)
        server = apps.PerfServer(server_host)
        server_conn = Connection(server_host.qp, active=False, auto_accept=False)
        server_conn.on_request = server.on_request
        client_host = apps.Host("c", send_wr=18)
        client = apps.PerfClient(client_host, apps.PerfRequest(op, size, iters))

        async def run_client(link):
            remote = apps.BufferInfo.decode(link.conn.peer_private_data)
            result = await client.run(remote)
            link.close()
            return result

        received, result = await connect_pair(
            server_conn, Connection(client_host.qp, active=True,
                                    private_data=client.private_data),
            lambda link: server.run(), run_client)
        assert (result.op, result.size, result.iterations) == (op, size, iters)
        assert result.bytes == size * iters and result.mb_per_sec >= 0
        assert "#bytes" in apps.perf_table(result)
        expected = hashlib.sha256(apps.pattern(size)).hexdigest()
        if op in ("write", "send"):
            assert hashlib.sha256(server.buffer.memory[:size]).hexdigest() == expected
        if op == "read":
            assert hashlib.sha256(client.buffer.memory).hexdigest() == expected
        if op == "atomic":
            assert int.from_bytes(server.buffer.memory[:8], "little") == iters
        assert received == (iters if op == "send" else 0)

    run(main())


def test_perf_server_rejects_what_it_cannot_do():
    async def main():
        server_host = apps.Host("s", recv_wr=8)
        server = apps.PerfServer(server_host)
        conn = Connection(server_host.qp, active=False, auto_accept=False)
        conn.on_request = server.on_request
        client_host = apps.Host("c")
        request = apps.PerfRequest("send", 16, 100)
        server_socket = await sockets.serve("127.0.0.1", 0, lambda: conn)
        port = server_socket.sockets[0].getsockname()[1]
        link = await sockets.connect("127.0.0.1", port, Connection(
            client_host.qp, active=True, private_data=request.encode()))
        with pytest.raises(sockets.MpaRejected) as info:
            await link.established()
        assert b"receive queue holds 7" in info.value.reason
        server_socket.close()
        await server_socket.wait_closed()

    run(main())
