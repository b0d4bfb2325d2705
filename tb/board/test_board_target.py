"""The boards' memory target (``boards.target.TargetSim``: every board's top but its PLL,
reset logic and DDR primitives) as generated Verilog under Verilator, with cocotbext-eth's
``RgmiiPhy`` on its RGMII pins and the model's whole NIC behind that PHY: the RDMA-target
test of the core (``tb/nic/test_target.py``, :class:`iwarp_tb.target_peer.TargetPeer`)
through RGMII, the MAC at 125 MHz and the core at 31.25 MHz (four bytes a cycle).

The three boards' tops differ only outside :class:`boards.target.TargetCore` (their PLL's
input, ``TXC``'s phase, a ``DELAYG`` on ``RD``, their LEDs), so this one simulation covers
what they share. The clocks are those of the boards: ``clk`` (the core) 32 ns, ``mac_clk``
8 ns, ``tx90_clk`` the same 2 ns later (``TXC``), ``RXC`` from the PHY model (8 ns, its
own phase).

* The lights: ``link`` once ``RXC`` has run, ``listening`` once the target has booted;
  ``activity`` while frames pass.
* A model initiator connects to port 7174 (MPA with CRCs), Writes random octets into the data
  region and Reads the whole region back, eight Reads outstanding (the target's IRD):
  ``connected`` is up, every octet read is what was written.
* A Write below the data region gets RFC 5040's Terminate (DDP tagged base or bounds), the
  peer closes the connection after it, the target answers its FIN (``error`` lights,
  ``connected`` drops) and listens again (``listening``); a second connection reads back
  what the first wrote, and writes and reads again.

The core's TCP timers are scaled down as in every simulation of it. Every frame both ways
is in ``build/cocotb/iwarp_board_target/board_target.pcap``.
"""

import logging
import random
from pathlib import Path

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, Timer
from cocotb.utils import get_sim_time
from cocotbext.eth import GmiiFrame, RgmiiPhy

from boards.target import CORE, CORE_HZ, IP, MAC, PLAN, TargetSim
from iwarp_model.pcap import PcapWriter
from iwarp_model.transport.frames import FrameEndpoint
from iwarp_model.transport.impair import VirtualClock
from iwarp_model.transport.rawtcp import RawStack
from iwarp_nic.apps.target import DATA
from iwarp_tb import cocotb_env
from iwarp_tb.runner import run_cocotb
from iwarp_tb.target_peer import TargetPeer
from iwarp_tb.tcprig import MODEL_TCP, NicTimers

MODEL_MAC = "02:00:00:00:08:01"
MODEL_IP = "192.168.1.1"
#: The boards' NicCore with its TCP timers scaled down as in every simulation of the core
#: (:class:`iwarp_tb.tcprig.NicTimers`).
SIM_CORE = dict(CORE, tcp=dict(CORE["tcp"], **NicTimers().engine_params(CORE_HZ)))
SLICE = 500                 # mac cycles between two turns of the model
TIMEOUT = 400_000           # mac cycles a step may take (3.2 ms)


class Board:
    """The simulated board, the PHY model on its pins and the model's NIC behind it."""

    def __init__(self, dut, seed):
        self.dut = dut
        self.phy = RgmiiPhy(dut.td, dut.tx_ctl, dut.txc, dut.rd, dut.rx_ctl, dut.rgmii_rx_clk,
                            speed=1000e6)
        for side in (self.phy.tx, self.phy.rx):
            side.log.setLevel(logging.WARNING)          # not a line per frame
        self.clock = VirtualClock()
        self.stack = RawStack(MODEL_MAC, MODEL_IP, send_frame=self._to_board, clock=self.clock,
                              rng=random.Random(seed), config=MODEL_TCP)
        self.endpoint = FrameEndpoint(self.stack)
        self.seen = {"activity": 0, "connected": 0, "error": 0}
        self.frames = {"to board": 0, "from board": 0}
        self.captured = []                  # (ns, frame) both ways, for board_target.pcap

    def _to_board(self, frame):
        self.frames["to board"] += 1
        self.captured.append((get_sim_time("ns"), bytes(frame)))
        self.phy.rx.send_nowait(GmiiFrame.from_payload(frame))

    async def start(self):
        dut = self.dut
        for name in ("rst", "mac_rst", "rgmii_rx_rst"):
            getattr(dut, name).value = 1
        cocotb.start_soon(Clock(dut.clk, round(1e9 / CORE_HZ), unit="ns").start())
        cocotb.start_soon(Clock(dut.mac_clk, 8, unit="ns").start())

        async def late():
            await Timer(2, unit="ns")
            await Clock(dut.tx90_clk, 8, unit="ns").start()

        cocotb.start_soon(late())
        await ClockCycles(dut.mac_clk, 8)
        for name in ("rst", "mac_rst", "rgmii_rx_rst"):
            getattr(dut, name).value = 0

    async def step(self):
        """One slice: the board runs, its frames go to the model, the model's timers run."""
        dut = self.dut
        for _ in range(SLICE // 50):
            await ClockCycles(dut.mac_clk, 50)
            for name in self.seen:
                self.seen[name] |= int(getattr(dut, name).value)
        self.clock.now = get_sim_time("ns") * 1e-9
        while not self.phy.tx.empty():
            frame = self.phy.tx.recv_nowait()
            assert frame.check_fcs(), "the board sent a frame with a bad FCS"
            assert not frame.error or not any(frame.error), "the board sent TX_ER"
            self.frames["from board"] += 1
            self.captured.append((frame.sim_time_start // 1000, frame.get_payload()))
            self.stack.receive_frame(frame.get_payload())
        self.stack.poll()

    async def until(self, condition, cycles=TIMEOUT):
        for _ in range(cycles // SLICE + 1):
            if condition():
                return
            await self.step()
        raise TimeoutError(f"not done after {cycles} mac cycles (frames {self.frames}, "
                           f"lights seen {self.seen}, connected now "
                           f"{int(self.dut.connected.value)})")

    def write_pcap(self, path):
        with PcapWriter(path) as pcap:
            for ns, frame in sorted(self.captured, key=lambda entry: entry[0]):
                pcap.write(frame, ns)

    async def run(self, steps):
        """Drive a :class:`~iwarp_tb.target_peer.TargetPeer` step; return its result."""
        try:
            condition = next(steps)
            while True:
                await self.until(condition)
                condition = steps.send(None)
        except StopIteration as done:
            return done.value


@cocotb.test()
async def memory_target(dut):
    rng = cocotb_env.rng()
    board = Board(dut, rng.randrange(1 << 16))
    try:
        await scenario(dut, board, rng)
    finally:
        board.write_pcap("board_target.pcap")       # in the build folder
    cocotb.log.info("frames: %s, simulated %.3f ms", board.frames, get_sim_time("ns") * 1e-6)


async def scenario(dut, board, rng):
    await board.start()
    await board.until(lambda: int(dut.link.value) == 1 and int(dut.listening.value) == 1,
                      40_000)
    assert board.seen == {"activity": 0, "connected": 0, "error": 0}, board.seen

    peer = TargetPeer(board.endpoint, IP, PLAN.ram_bytes - DATA)
    host, buffer, conn = await board.run(peer.write_and_read(rng))
    assert board.seen == {"activity": 1, "connected": 1, "error": 0}, board.seen
    assert int(dut.connected.value) == 1

    await board.run(peer.write_below(host, buffer, conn))
    await board.until(lambda: int(dut.connected.value) == 0)
    assert board.seen["error"] == 1, board.seen
    await board.until(lambda: int(dut.listening.value) == 1)        # once the peer's FIN

    host, buffer, conn = await board.run(peer.connect())
    await board.run(peer.read_back(host, buffer))              # the first connection's data
    await board.run(peer.writes(host, buffer, rng, count=4))
    await board.run(peer.read_back(host, buffer))
    assert int(dut.link.value) == 1


def test_board_target():
    # -Wno-CMPCONST: with a receive buffer of 32 KiB, TcpControl's clamp of the free space to
    # the largest window (65535 here) compares a 16-bit value with 0xFFFF, a constant
    # comparison Verilator refuses (yosys folds it away).
    run_cocotb("iwarp_board_target", TargetSim(mac=MAC, ip=IP, core=SIM_CORE),
               "test_board_target", test_dir=Path(__file__).parent, env={"IWARP_SEED": 8},
               build_args=["-Wno-CMPCONST"])
