"""The top-level modules ``make verilog`` generates, by Verilog module name.

Each entry builds a fresh component; :func:`iwarp_nic.axis.convert` gives it AXI-named ports.
Widths cover the 1G (1 byte), 10G (8 bytes) and widest (64 bytes) configurations; the MACs
are one per PHY interface (GMII: 1 byte, XGMII: 8 bytes), and so are the nodes built on them
(MAC + IP, MAC + IP + TCP with 16 connections) and the whole NIC; the host side's blocks work
at the DMA engine's width (8 and 64 bytes).
"""

from amaranth import unsigned

from .stream import BeatLayout, HalfRateSlice, SkidBuffer

#: Tops whose blocks are all part of another top at the same width (the one named, which
#: builds them with the same defaults): ``make lint`` checks their code there rather than
#: converting it twice.
INSIDE = {
    **{f"iwarp_{block}_w{n}": f"iwarp_nic_core_w{n}" for n in (1, 8)
       for block in ("tcp_node", "ip_node", "engine_c16", "host_control_c16")},
    **{f"iwarp_{block}_w8": "iwarp_nic_core_w8" for block in (
        "host_send_queue_c16", "host_receive_queue_c16", "host_completion_c16",
        "host_sq_unpacker", "host_cqe_packer")},
    "iwarp_mac_gmii": "iwarp_nic_core_w1",
    "iwarp_mac_xgmii": "iwarp_nic_core_w8",
    **{f"iwarp_{block}_w{n}": f"iwarp_engine_c16_w{n}" for n in (1, 8, 64)
       for block in ("ddp_receive_c16", "mpa_deframer_c16", "rdmap_send_scheduler_c16")},
}


def outermost():
    """The names of :func:`tops` not in :data:`INSIDE`."""
    return [name for name in tops() if name not in INSIDE]


def tops():
    """``{module_name: factory}`` for every generated top-level module."""
    from .apps.target_host import TargetHost
    from .axi_ram import AxiRam
    from .core import NicCore
    from .crc import CRC32CEngine, CRC32Engine
    from .ddp.emit import SegmentEmitter
    from .ddp.outstanding import OutstandingTable
    from .ddp.placement import SegmentPlacer
    from .ddp.receive import ConnectionsReceiver, StreamReceiver
    from .ddp.rtr import RtrCheck
    from .ddp.segment import SegmentParser
    from .ddp.send import StreamSender
    from .ddp.stag import StagTable
    from .dma import DmaMaster, ReadReserve
    from .engine import ConnectionsEngine, IwarpEngine
    from .eth import GmiiMac, XgmiiMac
    from .eth.cdc import MacRxCrossing, MacTxCrossing
    from .fifo import PacketFifo
    from .hdrparse import HeaderEmitter, HeaderParser
    from .headers import ETHERNET
    from .host import AxiLiteManager, AxiLiteTarget
    from .host.completion import CompletionWriter
    from .host.control import HostControl
    from .host.descriptor import DescriptorPacker, DescriptorUnpacker
    from .host.formats import Cqe, SqWqe
    from .host.receive_queue import ReceiveQueueEngine
    from .host.send_queue import SendQueueEngine
    from .ip import IpStack
    from .mpa import (
        FpduDeframer,
        FpduFramer,
        FrameGather,
        MpaNegotiator,
        MpaReceiver,
        StartupReader,
        StartupWriter,
    )
    from .mpa.gather import max_frame_ulpdu
    from .node import IpNode, TcpNode
    from .rdmap import (
        AtomicExecutor,
        RequestIssuer,
        RequestResponder,
        SendScheduler,
        TerminateEmitter,
        TerminateParser,
    )
    from .tcp.isn import IsnGenerator
    from .tcp.lookup import ConnLookup
    from .trim import HeadTrim
    from .width import BeatDownsizer, BeatUpsizer

    tops = {}
    for n in (1, 8, 64):
        tops[f"iwarp_eth_parser_w{n}"] = lambda n=n: HeaderParser(ETHERNET, n, err=True)
        tops[f"iwarp_eth_emitter_w{n}"] = lambda n=n: HeaderEmitter(ETHERNET, n, err=True)
        tops[f"iwarp_skid_w{n}"] = lambda n=n: SkidBuffer(BeatLayout(n, err=True))
        tops[f"iwarp_half_slice_w{n}"] = lambda n=n: HalfRateSlice(BeatLayout(n, err=True))
        tops[f"iwarp_crc32c_w{n}"] = lambda n=n: CRC32CEngine(n)
        tops[f"iwarp_crc32_w{n}"] = lambda n=n: CRC32Engine(n)
        tops[f"iwarp_ip_stack_w{n}"] = lambda n=n: IpStack(n)
        tops[f"iwarp_head_trim_w{n}"] = lambda n=n: HeadTrim(n, 11, err=True)
        tops[f"iwarp_packet_fifo_w{n}"] = lambda n=n: PacketFifo(n, 64)
        tops[f"iwarp_mpa_framer_w{n}"] = lambda n=n: FpduFramer(n)
        tops[f"iwarp_mpa_deframer_w{n}"] = lambda n=n: FpduDeframer(n)
        # Several connections' pieces, behind a gather of 16 connections and 4 KiB rings.
        tops[f"iwarp_mpa_deframer_c16_w{n}"] = lambda n=n: FpduDeframer(
            n, conns=16, max_ulpdu=max_frame_ulpdu(4096, 1460))
        tops[f"iwarp_mpa_startup_reader_w{n}"] = lambda n=n: StartupReader(n)
        tops[f"iwarp_mpa_startup_writer_w{n}"] = lambda n=n: StartupWriter(n)
        tops[f"iwarp_mpa_negotiator_w{n}"] = lambda n=n: MpaNegotiator(n)
        tops[f"iwarp_mpa_frame_gather_w{n}"] = lambda n=n: FrameGather(n)
        tops[f"iwarp_mpa_receiver_w{n}"] = lambda n=n: MpaReceiver(n)
        tops[f"iwarp_rdmap_terminate_w{n}"] = lambda n=n: TerminateEmitter(n)
        tops[f"iwarp_rdmap_terminate_parser_w{n}"] = lambda n=n: TerminateParser(n)
        tops[f"iwarp_rdmap_terminate_parser_c16_w{n}"] = lambda n=n: TerminateParser(n, conns=16)
        tops[f"iwarp_ddp_segment_w{n}"] = lambda n=n: SegmentParser(n)
        tops[f"iwarp_ddp_segment_c16_w{n}"] = lambda n=n: SegmentParser(n, conns=16)
        tops[f"iwarp_ddp_segment_placer_w{n}"] = lambda n=n: SegmentPlacer(n)
        tops[f"iwarp_ddp_segment_placer_c16_w{n}"] = lambda n=n: SegmentPlacer(n, conns=16)
        tops[f"iwarp_ddp_receive_w{n}"] = lambda n=n: StreamReceiver(n)
        tops[f"iwarp_ddp_receive_c16_w{n}"] = lambda n=n: ConnectionsReceiver(n)
        tops[f"iwarp_ddp_emit_w{n}"] = lambda n=n: SegmentEmitter(n)
        tops[f"iwarp_ddp_send_w{n}"] = lambda n=n: StreamSender(n)
        tops[f"iwarp_ddp_send_c16_w{n}"] = lambda n=n: StreamSender(n, conns=16)
        tops[f"iwarp_rdmap_send_scheduler_w{n}"] = lambda n=n: SendScheduler(n)
        tops[f"iwarp_rdmap_send_scheduler_c16_w{n}"] = lambda n=n: SendScheduler(n, conns=16)
        tops[f"iwarp_engine_w{n}"] = lambda n=n: IwarpEngine(n)
        tops[f"iwarp_engine_c16_w{n}"] = lambda n=n: ConnectionsEngine(n)
    for n in (1, 8):
        tops[f"iwarp_mac_rx_cdc_w{n}"] = lambda n=n: MacRxCrossing(n)
        tops[f"iwarp_mac_tx_cdc_w{n}"] = lambda n=n: MacTxCrossing(n)
        tops[f"iwarp_ip_node_w{n}"] = lambda n=n: IpNode(n)
        tops[f"iwarp_tcp_node_w{n}"] = lambda n=n: TcpNode(n)
        tops[f"iwarp_nic_core_w{n}"] = lambda n=n: NicCore(n)
    # NicCore at its fewest: one connection, completion queue and shared receive queue (their
    # registers and doorbells then carry no index).
    tops["iwarp_nic_core_c1_w8"] = lambda: NicCore(8, conns=1, cqs=1, srqs=1)
    for n in (8, 64):       # the host side works at the DMA engine's width (64 to 512 bits)
        tops[f"iwarp_dma_w{n}"] = lambda n=n: DmaMaster(n, write_clients=3, read_clients=3)
        tops[f"iwarp_axi_ram_w{n}"] = lambda n=n: AxiRam(n, 65536)
        tops[f"iwarp_dma_read_reserve_w{n}"] = lambda n=n: ReadReserve(n, 64)
        tops[f"iwarp_host_sq_unpacker_w{n}"] = lambda n=n: DescriptorUnpacker(SqWqe, n)
        tops[f"iwarp_host_cqe_packer_w{n}"] = lambda n=n: DescriptorPacker(Cqe, n)
        tops[f"iwarp_host_send_queue_c16_w{n}"] = lambda n=n: SendQueueEngine(n)
        tops[f"iwarp_host_receive_queue_c16_w{n}"] = lambda n=n: ReceiveQueueEngine(n)
        tops[f"iwarp_host_completion_c16_w{n}"] = lambda n=n: CompletionWriter(n, writers=2)
    for n in (1, 8, 64):
        tops[f"iwarp_host_control_c16_w{n}"] = lambda n=n: HostControl(n)
    tops["iwarp_host_axil_manager_w4"] = lambda: AxiLiteManager(16, 4)
    # A memory target's host (its plan's default sizes; board constants for the addresses).
    tops["iwarp_target_host"] = lambda: TargetHost(mac=0x0200_0000_0005, ip=0xC0A8_0132,
                                                   keys=0x5EED)
    # The ECPIX-5's arrangement: a two-byte node behind a GMII MAC in a domain of its own.
    tops["iwarp_tcp_node_w2_gmii"] = lambda: TcpNode(2, mac_bytes=1)
    tops["iwarp_beat_upsizer_w1_w8"] = lambda: BeatUpsizer(1, 8, err=True)
    tops["iwarp_beat_downsizer_w8_w1"] = lambda: BeatDownsizer(8, 1, err=True)
    tops["iwarp_rdmap_request_responder"] = RequestResponder
    tops["iwarp_rdmap_request_responder_c16"] = lambda: RequestResponder(conns=16)
    tops["iwarp_rdmap_atomic_executor"] = AtomicExecutor
    tops["iwarp_rdmap_request_issuer"] = RequestIssuer
    tops["iwarp_rdmap_request_issuer_c16"] = lambda: RequestIssuer(conns=16)
    tops["iwarp_ddp_outstanding_c16"] = lambda: OutstandingTable(16)
    tops["iwarp_ddp_rtr_check"] = RtrCheck
    tops["iwarp_ddp_rtr_check_c16"] = lambda: RtrCheck(16)
    tops["iwarp_ddp_stag_e256"] = lambda: StagTable(256)
    tops["iwarp_ddp_stag_e4096"] = lambda: StagTable(4096)
    tops["iwarp_tcp_isn"] = lambda: IsnGenerator(156_250_000)
    tops["iwarp_tcp_lookup_c256"] = lambda: ConnLookup(256)
    tops["iwarp_skid_u32"] = lambda: SkidBuffer(unsigned(32))
    tops["iwarp_axil_target"] = AxiLiteTarget
    tops["iwarp_mac_gmii"] = GmiiMac
    tops["iwarp_mac_xgmii"] = XgmiiMac
    return tops
