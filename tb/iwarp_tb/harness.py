"""A generated top-level module, compiled natively with Verilator and driven from Python.

:class:`Harness` builds ``harness.cpp`` with the module into a shared library (cached per module
under ``build/harness/``, like :class:`~iwarp_tb.runner.BeatPlayer`) and loads it with ctypes.
Python queues work and collects results; the clock runs in C++ at millions of cycles per second,
fast enough to keep up with a real peer (Linux through a TAP device, :mod:`iwarp_tb.tap`).

* Plain ports (``mac``, ``ip``, keys, counters: any width): :meth:`Harness.set` and
  :meth:`Harness.get`.
* AXI-Stream ports (:func:`iwarp_nic.axis.axi_ports` names), by prefix (``s_axis``,
  ``s_axis_tcp_header``, ``m_axis_tcp_payload``, ...): :meth:`Harness.push` queues transfers on an
  input, :meth:`Harness.pull` takes what came out of an output. A beat stream (``tkeep`` and
  ``tlast``) carries packets (:class:`~iwarp_tb.beats.Packet`: bytes with ``err`` from
  ``tuser``), split and joined by :mod:`iwarp_tb.beats`; any other stream carries one integer
  (its packed ``tdata``) per transfer. Inputs may idle and outputs stall at random
  (:meth:`Harness.set_idle`, :meth:`Harness.set_ready`).
* With ``phy="gmii"`` or ``"xgmii"``, a PHY on the MAC's pins: :meth:`Harness.send_frame` queues
  an Ethernet frame into its RX pins (the C++ side adds preamble, SFD, FCS and the 12-byte gap;
  XGMII starts in lane 0), :meth:`Harness.frames` returns the frames it sent (preamble and FCS
  checked and stripped).
* Host memory (an AXI4 subordinate in C++) on each AXI4 manager port of the module (prefix ``p``
  where ``p_awvalid`` is an output and ``p_awlen`` exists, such as ``m_axi``):
  :meth:`Harness.memory` gives its :class:`HostMemory`, a flat byte array from address 0 with
  configurable latency and random stalls, protocol checks, counters, and a shadow-memory check
  that finds every byte the module writes outside the ranges marked writable.
* A register master (an AXI4-Lite manager in C++) on each AXI4-Lite subordinate port (prefix
  ``p`` where ``p_awvalid`` is an input and there is no ``p_awlen``, such as ``s_axil``):
  :meth:`Harness.registers` gives its :class:`RegisterPort`, whose reads and writes run the
  clock until the response.
* :meth:`Harness.run` runs the clock; an optional waveform (FST when the lz4 headers are
  installed, else VCD) records every cycle.
"""

import ctypes
import enum
from pathlib import Path

from amaranth.lib import data, stream, wiring

from iwarp_nic import eth
from iwarp_nic.axis import axi_ports, axis_prefix

from . import toolchain
from .beats import Beat, Packet, from_beats, to_columns
from .runner import verilate, write_verilog

__all__ = ["Harness", "HostMemory", "RegisterPort", "RegisterError", "PHY_PINS", "pack",
           "unpack"]

#: The MAC pins of each PHY: the harness drives the MAC's inputs ("in") and decodes its
#: outputs ("out").
PHY_PINS = {
    "gmii": {"gmii_rxd": "in", "gmii_rx_dv": "in", "gmii_rx_er": "in",
             "gmii_txd": "out", "gmii_tx_en": "out", "gmii_tx_er": "out"},
    "xgmii": {"xgmii_rxd": "in", "xgmii_rxc": "in", "xgmii_txd": "out", "xgmii_txc": "out"},
}
#: Default clock by PHY (MHz): GMII 125, XGMII 156.25.
PHY_CLOCK_MHZ = {None: 100.0, "gmii": 125.0, "xgmii": 156.25}
MIN_FRAME = eth.MIN_FRAME - 4  # the shortest frame without its FCS

_SOURCES = Path(__file__).parent
_HARNESS = _SOURCES / "harness.cpp"
_HEADERS = [_SOURCES / "vports.h"]
_FLAG_NAMES = {1: "bad FCS", 2: "PHY error", 4: "bad preamble"}
_ALWAYS = 1 << 32
_AXIS_SIGNALS = ("tdata", "tkeep", "tlast", "tuser", "tvalid", "tready")
_RESPONSES = ("OKAY", "EXOKAY", "SLVERR", "DECERR")
_MAX_RECORDS = 64  # violations kept per memory (as harness.cpp keeps faults)
_STATS = ("read_bursts", "write_bursts", "read_bytes", "write_bytes", "violations", "faults")


def _members(names, is_input):
    return dict.fromkeys(names.split(), is_input)


# The members of an AXI port group, with whether each is an input of the module: those the
# harness needs, and those it drives with 0 (inputs) or ignores (outputs) when they exist.
_AXI4 = {**_members("awid awaddr awlen awsize awburst awvalid wdata wstrb wlast wvalid bready "
                    "arid araddr arlen arsize arburst arvalid rready", False),
         **_members("awready wready bid bresp bvalid arready rid rdata rresp rlast rvalid", True)}
_AXI4_OPTIONAL = _members("awlock awcache awprot awqos awregion arlock arcache arprot arqos "
                          "arregion", False)
_AXIL = {**_members("awaddr awvalid wdata wstrb wvalid bready araddr arvalid rready", True),
         **_members("awready wready bresp bvalid arready rdata rresp rvalid", False)}
_AXIL_OPTIONAL = _members("awprot arprot", True)


class _Stream:
    """One AXI-Stream port: its index on its side, ``tdata`` width, and for beat streams
    ``data_bytes`` (None for a struct stream)."""

    def __init__(self, index, prefix, ports):
        self.index = index
        self.prefix = prefix
        self.signals = {s for s in _AXIS_SIGNALS if f"{prefix}_{s}" in ports}
        self.tdata_bits = ports[f"{prefix}_tdata"]
        self.tdata_bytes = (self.tdata_bits + 7) // 8
        self.data_bytes = (ports[f"{prefix}_tkeep"] if {"tkeep", "tlast"} <= self.signals
                           else None)
        self.partial = []  # output beats of a packet not yet ended


class _AxiGroup:
    """The ports of one AXI4 manager (``memory``) or AXI4-Lite subordinate port group: its index
    among the groups of its kind, its signals (port names) and widths."""

    def __init__(self, index, prefix, ports, memory):
        required, optional = (_AXI4, _AXI4_OPTIONAL) if memory else (_AXIL, _AXIL_OPTIONAL)
        wrong = [f"{prefix}_{m}" for m, is_in in required.items()
                 if ports.get(f"{prefix}_{m}", (0, not is_in))[1] != is_in]
        if wrong:
            raise ValueError(f"AXI port group {prefix}: missing or of the wrong direction: "
                             f"{', '.join(wrong)}")
        self.index, self.prefix = index, prefix
        self.optional = {m for m, is_in in optional.items()
                         if ports.get(f"{prefix}_{m}", (0, not is_in))[1] == is_in}
        self.signals = {f"{prefix}_{m}" for m in [*required, *self.optional]}
        width = {m: ports[f"{prefix}_{m}"][0] for m in required}
        self.data_bytes = n = width["wdata"] // 8
        self.addr_width = width["awaddr"]
        # Data: whole bytes, a power of two for the memory, at most 64 bits for the registers.
        fits = n <= 8 if not memory else n & (n - 1) == 0
        if not (n and fits and width["wdata"] == width["rdata"] == 8 * n == 8 * width["wstrb"]
                and width["araddr"] == self.addr_width <= 64):
            raise ValueError(f"AXI port group {prefix}: unsupported widths {width}")

    @staticmethod
    def find(ports):
        """``(memories, registers)``: the groups of ``ports`` (``{name: (width, is_input)}``)
        by prefix."""
        memories, registers = {}, {}
        for port, (_, is_in) in ports.items():
            prefix = port.removesuffix("_awvalid")
            if prefix == port:
                continue
            has_len = f"{prefix}_awlen" in ports
            if not is_in and has_len:
                memories[prefix] = _AxiGroup(len(memories), prefix, ports, True)
            elif is_in and not has_len:
                registers[prefix] = _AxiGroup(len(registers), prefix, ports, False)
        return memories, registers


def _probability(p):
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"a probability is between 0 and 1, not {p}")
    return round(p * _ALWAYS)


class Harness:
    """Module ``name`` generated from ``component``, compiled natively and ready to run.

    Parameters
    ----------
    name : str
        The Verilog module name (``build/verilog/<name>.v``; the build goes to
        ``build/harness/<name>[-trace|-vcd]/``).
    component : wiring.Component
        Its ports become the module's (:func:`iwarp_nic.axis.axi_ports`).
    phy : None, "gmii" or "xgmii"
        Attach a PHY model to the MAC pins of :data:`PHY_PINS` (which the module must have).
    trace : path or None
        Write a waveform of every cycle there (see :meth:`tracing`): VCD for a ``.vcd``
        suffix, else FST if :func:`toolchain.have_fst`, else VCD (the suffix is changed to
        match; see :attr:`trace`). Traced builds are slower.
    clock_mhz : float
        The clock the waveform and :attr:`time_ns` assume (by default from the PHY).
    seed : int
        Seeds the idle and stall draws of every stream.
    params : any
        What determines ``component`` besides the gateware sources (its ``repr`` is used):
        given, the Verilog is reused while neither changes (see
        :func:`~iwarp_tb.runner.write_verilog`).
    memory_bytes : int
        The size of each host memory (:meth:`memory`), from address 0.
    sources : paths
        Verilog files of the modules ``component`` instantiates as black boxes
        (``amaranth.hdl.Instance``), built with it.
    taps : names
        Output pins to decode as a PHY's TX pins, as :meth:`frames` does the MAC's: tap ``t``
        is the module's outputs ``t_<pin>`` for the TX pins of :data:`PHY_PINS` (GMII or
        XGMII, the same for every tap and the PHY); :meth:`tap_frames` gives its frames.

    The module is reset for 4 cycles when the harness is made; :attr:`cycle` counts from there.
    Use as a context manager or call :meth:`close` (which finishes the waveform).
    """

    def __init__(self, name, component, *, phy=None, trace=None, clock_mhz=None, seed=0,
                 params=None, memory_bytes=1 << 24, taps=(), sources=()):
        if phy not in (None, *PHY_PINS):
            raise ValueError(f"phy must be None, 'gmii' or 'xgmii', not {phy!r}")
        if not isinstance(memory_bytes, int) or memory_bytes < 1:
            raise ValueError(f"memory_bytes must be a positive integer, not {memory_bytes!r}")
        ports = {port: (len(value), direction.name == "Input")
                 for port, (value, direction) in axi_ports(component).items()}
        widths = {port: width for port, (width, _) in ports.items()}
        self.name = name
        self.phy = phy
        self.clock_mhz = clock_mhz or PHY_CLOCK_MHZ[phy]
        self._inputs, self._outputs = {}, {}
        in_stream = set()
        for member_name, member in component.signature.members.items():
            if member.is_signature and isinstance(member.signature, stream.Signature):
                prefix = axis_prefix(member_name, member.flow)
                side = self._inputs if member.flow == wiring.In else self._outputs
                side[prefix] = _Stream(len(side), prefix, widths)
                in_stream |= {f"{prefix}_{s}" for s in side[prefix].signals}
        pins = PHY_PINS.get(phy, {})
        missing = set(pins) - set(ports)
        if missing:
            raise ValueError(f"{name} has no {phy} pins {sorted(missing)}")
        self._pins = set(pins)
        self.taps = {}
        for tap in taps:
            kinds = [kind for kind, tap_pins in PHY_PINS.items()
                     if all(f"{tap}_{pin}" in ports for pin, way in tap_pins.items()
                            if way == "out")]
            if len(kinds) != 1 or phy not in (None, kinds[0]) or \
                    len({*kinds, *self.taps.values()}) != 1:
                raise ValueError(f"{name}: tap {tap!r} is not one kind of TX pins (PHY {phy})")
            self.taps[tap] = kinds[0]
        self._pins |= {f"{tap}_{pin}" for tap, kind in self.taps.items()
                       for pin, way in PHY_PINS[kind].items() if way == "out"}
        self._memory_groups, self._register_groups = _AxiGroup.find(ports)
        in_axi = set().union(*(g.signals for g in (*self._memory_groups.values(),
                                                     *self._register_groups.values())))
        plain = [(p, v) for p, v in ports.items() if p not in in_stream | in_axi]
        self._ports = {port: (index, width, is_in)
                       for index, (port, (width, is_in)) in enumerate(plain)}

        source = write_verilog(name, component, params=params)
        fst = trace is not None and Path(trace).suffix != ".vcd" and toolchain.have_fst()
        self.trace = None if trace is None else Path(trace).with_suffix(".fst" if fst else ".vcd")
        kind = "" if trace is None else "-trace" if fst else "-vcd"
        build_dir = toolchain.BUILD / "harness" / (name + kind)
        build_dir.mkdir(parents=True, exist_ok=True)
        glue = build_dir / "harness_glue.h"
        text = self._glue()
        if not glue.exists() or glue.read_text() != text:
            glue.write_text(text)
        cflags = [f"-DVTOP=V{name}", f"-DVTOP_H='\"V{name}.h\"'", "-fPIC", "-fno-gnu-unique",
                  "-fvisibility=hidden", "-fvisibility-inlines-hidden"]
        args = []
        if trace is not None:
            cflags.append("-DHARNESS_TRACE_FST" if fst else "-DHARNESS_TRACE_VCD")
            args.append("--trace-fst" if fst else "--trace")
        library = verilate(name, [source, *sources, _HARNESS], build_dir, "harness.so",
                           headers=[*_HEADERS, glue], cflags=cflags, ldflags=["-shared"],
                           args=args)
        self._lib = _load(library, phy is not None, bool(phy or self.taps))
        if self.trace is not None:
            self.trace.parent.mkdir(parents=True, exist_ok=True)
        period_ps = round(1e6 / self.clock_mhz)
        self._h = self._lib.hs_new(seed, None if self.trace is None else str(self.trace).encode(),
                                   period_ps, memory_bytes)
        self._memories = {p: HostMemory(self, g, memory_bytes)
                          for p, g in self._memory_groups.items()}
        self._registers = {p: RegisterPort(self, g) for p, g in self._register_groups.items()}

    def _glue(self):
        """harness_glue.h: this module's ports for harness.cpp."""
        lines = [f"// Generated by iwarp_tb.harness for {self.name}: do not edit.", "#pragma once",
                 ""]
        if self.phy:
            lines += [f"#define HARNESS_PHY_{self.phy.upper()} 1"]
        line = self.phy or next(iter(self.taps.values()), None)
        if line:
            lines += [f"#define HARNESS_LINE_{line.upper()} 1", ""]
        lines += ["namespace {", "",
                  "void make_streams(std::vector<Input> &in, std::vector<Output> &out) {"]
        lines += [f"    in.emplace_back({s.tdata_bytes});  // {p}" for p, s in self._inputs.items()]
        lines += [f"    out.emplace_back({s.tdata_bytes});  // {p}"
                  for p, s in self._outputs.items()]
        lines += ["}", "",
                  "void drive_streams(VTOP &top, std::vector<Input> &in, "
                  "std::vector<Output> &out) {"]
        for p, s in self._inputs.items():
            lines += [f"    top.{p}_tvalid = in[{s.index}].offer();",
                      f"    if (in[{s.index}].offering) {{",
                      f"        put(top.{p}_tdata, in[{s.index}].front_data(), {s.tdata_bytes});"]
            lines += [f"        top.{p}_{sig} = in[{s.index}].front_{field}();"
                      for sig, field in (("tkeep", "keep"), ("tlast", "last"), ("tuser", "user"))
                      if sig in s.signals]
            lines += ["    }"]
        lines += [f"    top.{p}_tready = out[{s.index}].draw_ready();"
                  for p, s in self._outputs.items()]
        lines += ["    (void)in;", "    (void)out;", "}", "",
                  "bool sample_streams(VTOP &top, std::vector<Input> &in, "
                  "std::vector<Output> &out) {",
                  "    bool arrived = false;"]
        for p, s in self._inputs.items():
            lines += [f"    if (in[{s.index}].offering && top.{p}_tready) in[{s.index}].accept();"]
        for p, s in self._outputs.items():
            fields = [f"top.{p}_{sig}" if sig in s.signals else default
                      for sig, default in (("tkeep", "0"), ("tlast", "1"), ("tuser", "0"))]
            lines += [f"    if (out[{s.index}].ready_now && top.{p}_tvalid) {{",
                      f"        uint8_t data[{s.tdata_bytes}];",
                      f"        get(top.{p}_tdata, data, {s.tdata_bytes});",
                      f"        arrived |= out[{s.index}].record(data, {', '.join(fields)});",
                      "    }"]
        lines += ["    (void)in;", "    (void)out;", "    (void)top;", "    return arrived;", "}",
                  "", "void set_port(VTOP &top, int port, const uint8_t *bytes) {",
                  "    switch (port) {"]
        lines += [f"    case {i}: put(top.{p}, bytes, {(w + 7) // 8}); break;"
                  for p, (i, w, is_in) in self._ports.items() if is_in and p not in self._pins]
        lines += ["    default: (void)top; (void)bytes;", "    }", "}", "",
                  "void get_port(VTOP &top, int port, uint8_t *bytes) {", "    switch (port) {"]
        lines += [f"    case {i}: get(top.{p}, bytes, {(w + 7) // 8}); break;"
                  for p, (i, w, _) in self._ports.items()]
        lines += ["    default: (void)top; (void)bytes;", "    }", "}", ""]
        lines += self._memory_glue() + self._register_glue() + self._tap_glue()
        lines += ["}  // namespace", ""]
        return "\n".join(lines)

    def _tap_glue(self):
        """make_taps and sample_taps of harness_glue.h (templates: the tap type, harness.cpp's
        Phy, is defined after the glue)."""
        lines = ["template <typename Tap> void make_taps(std::vector<Tap> &taps) {",
                 f"    taps.resize({len(self.taps)});", "}", "",
                 "template <typename Tap> bool sample_taps(VTOP &top, std::vector<Tap> &taps, "
                 "uint64_t cycle) {", "    bool ended = false;"]
        for k, (tap, kind) in enumerate(self.taps.items()):
            pins = ("gmii_txd", "gmii_tx_en", "gmii_tx_er") if kind == "gmii" else \
                ("xgmii_txd", "xgmii_txc")
            args = ", ".join(f"top.{tap}_{pin}" for pin in pins)
            error = "" if kind == "gmii" else ", false"
            lines += [f"    ended |= taps[{k}].sample_tx({args}{error}, cycle);  // {tap}"]
        lines += ["    (void)top;", "    (void)taps;", "    (void)cycle;", "    return ended;",
                  "}", ""]
        return lines

    def _memory_glue(self):
        """make_memories, drive_memories and sample_memories of harness_glue.h."""
        groups = self._memory_groups.items()
        lines = ["void make_memories(std::vector<HostMemory> &memories, uint64_t bytes) {"]
        lines += [f"    memories.emplace_back({g.data_bytes}, bytes);  // {p}" for p, g in groups]
        lines += ["    (void)memories;", "    (void)bytes;", "}", "",
                  "void drive_memories(VTOP &top, std::vector<HostMemory> &memories, "
                  "uint64_t cycle) {"]
        for p, g in groups:
            lines += [f"    {{  // {p}", f"        HostMemory &m = memories[{g.index}];",
                      "        m.drive(cycle);"]
            lines += [f"        top.{p}_{s} = m.out.{s};" for s in (
                "awready", "wready", "arready", "bvalid", "bid", "bresp", "rvalid", "rid",
                "rresp", "rlast")]
            lines += [f"        put(top.{p}_rdata, m.out.rdata.data(), {g.data_bytes});", "    }"]
        lines += ["    (void)top;", "    (void)memories;", "    (void)cycle;", "}", "",
                  "void sample_memories(VTOP &top, std::vector<HostMemory> &memories, "
                  "uint64_t cycle) {"]
        for p, g in groups:
            n, strb = g.data_bytes, (g.data_bytes + 7) // 8
            lines += [f"    {{  // {p}", f"        ManagerPins &in = memories[{g.index}].in;"]
            for ch in ("aw", "ar"):
                fields = ", ".join(f"top.{p}_{ch}{f}" for f in ("addr", "id", "len", "size",
                                                               "burst"))
                lines += [f"        in.{ch}valid = top.{p}_{ch}valid;",
                          f"        if (in.{ch}valid) in.{ch} = {{{fields}}};"]
            lines += [f"        in.wvalid = top.{p}_wvalid;",
                      "        if (in.wvalid) {",
                      f"            get(top.{p}_wdata, in.w.data.data(), {n});",
                      f"            get(top.{p}_wstrb, in.w.strb.data(), {strb});",
                      f"            in.w.last = top.{p}_wlast;",
                      "        }",
                      f"        in.bready = top.{p}_bready;",
                      f"        in.rready = top.{p}_rready;",
                      f"        memories[{g.index}].sample(cycle);", "    }"]
        lines += ["    (void)top;", "    (void)memories;", "    (void)cycle;", "}", ""]
        return lines

    def _register_glue(self):
        """make_registers, drive_registers and sample_registers of harness_glue.h."""
        groups = self._register_groups.items()
        lines = ["void make_registers(std::vector<RegisterMaster> &registers) {"]
        lines += [f"    registers.emplace_back();  // {p}" for p in self._register_groups]
        lines += ["    (void)registers;", "}", "",
                  "void drive_registers(VTOP &top, const std::vector<RegisterMaster> &registers) {"]
        for p, g in groups:
            lines += [f"    {{  // {p}", f"        const RegisterMaster &r = registers[{g.index}];"]
            lines += [f"        top.{p}_{s} = r.{field};" for s, field in (
                ("awvalid", "aw_on"), ("awaddr", "addr"), ("wvalid", "w_on"), ("wdata", "wdata"),
                ("bready", "b_wait"), ("arvalid", "ar_on"), ("araddr", "addr"),
                ("rready", "r_wait"))]
            lines += [f"        top.{p}_wstrb = {(1 << g.data_bytes) - 1:#x};"]
            lines += [f"        top.{p}_{s} = 0;" for s in sorted(g.optional)]
            lines += ["    }"]
        lines += ["    (void)top;", "    (void)registers;", "}", "",
                  "void sample_registers(VTOP &top, std::vector<RegisterMaster> &registers) {"]
        for p, g in groups:
            args = ", ".join(f"top.{p}_{s}" for s in ("awready", "wready", "bvalid", "bresp",
                                                      "arready", "rvalid", "rdata", "rresp"))
            lines += [f"    registers[{g.index}].sample({args});  // {p}"]
        lines += ["    (void)top;", "    (void)registers;", "}", ""]
        return lines

    # Plain ports.

    def _port(self, port):
        if port not in self._ports:
            raise KeyError(f"{self.name} has no plain port {port!r} "
                           f"(ports: {', '.join(self._ports)})")
        return self._ports[port]

    def set(self, port, value):
        """Drive input ``port`` with ``value`` (an unsigned integer of its width) from now on."""
        index, width, is_in = self._port(port)
        if not is_in or port in self._pins:
            raise ValueError(f"{port} is {'a PHY pin' if is_in else 'an output'}: it can't be set")
        if not 0 <= value < 1 << width:
            raise ValueError(f"{port} is {width} bits wide: {value:#x} does not fit")
        self._lib.hs_set(self._live, index, value.to_bytes((width + 7) // 8, "little"))

    def get(self, port):
        """The value of ``port`` now (an output after the last clock edge)."""
        index, width, _ = self._port(port)
        buf = ctypes.create_string_buffer((width + 7) // 8)
        self._lib.hs_get(self._live, index, buf)
        return int.from_bytes(buf.raw, "little")

    # Streams.

    def _stream(self, side, prefix):
        if prefix not in side:
            raise KeyError(f"{self.name} has no stream {prefix!r} (streams: "
                           f"{', '.join([*self._inputs, *self._outputs])})")
        return side[prefix]

    def push(self, prefix, items):
        """Queue transfers on input stream ``prefix``: packets (bytes or
        :class:`~iwarp_tb.beats.Packet`, whose ``err`` sets ``tuser`` on the last beat) for a
        beat stream, integers (the packed ``tdata``) for any other."""
        s = self._stream(self._inputs, prefix)
        if s.data_bytes is not None:
            columns = to_columns(items, s.data_bytes)
            count, data, keep, last, user = columns
        else:
            items = list(items)
            for value in items:
                if not 0 <= value < 1 << s.tdata_bits:
                    raise ValueError(f"{prefix}: {value:#x} does not fit {s.tdata_bits} bits")
            count = len(items)
            data = b"".join(v.to_bytes(s.tdata_bytes, "little") for v in items)
            keep, last, user = bytes(8 * count), b"\x01" * count, bytes(count)
        if count:
            self._lib.hs_push(self._live, s.index, count, data, keep, last, user)

    def pending(self, prefix):
        """Transfers queued on input stream ``prefix`` that the module has not yet taken."""
        return self._lib.hs_pending(self._live, self._stream(self._inputs, prefix).index)

    def pull(self, prefix):
        """What came out of output stream ``prefix`` since the last call: whole packets
        (:class:`~iwarp_tb.beats.Packet`, beats checked against the stream rules) for a beat
        stream, one integer per transfer for any other. A packet still without its last beat
        stays for the next call."""
        s = self._stream(self._outputs, prefix)
        count = self._lib.hs_out_count(self._live, s.index)
        data = ctypes.create_string_buffer(count * s.tdata_bytes)
        keep = (ctypes.c_uint64 * count)()
        last = ctypes.create_string_buffer(count)
        user = ctypes.create_string_buffer(count)
        self._lib.hs_pull(self._live, s.index, data, keep, last, user)
        n = s.tdata_bytes
        values = [int.from_bytes(data.raw[i * n:(i + 1) * n], "little") for i in range(count)]
        if s.data_bytes is None:
            return values
        beats = s.partial + [Beat(values[i], keep[i], bool(last.raw[i]), bool(user.raw[i]))
                             for i in range(count)]
        ends = max((i + 1 for i, b in enumerate(beats) if b.last), default=0)
        s.partial = beats[ends:]
        return from_beats(beats[:ends], s.data_bytes)

    def set_ready(self, prefix, probability, seed=0):
        """Hold output ``prefix``'s ``tready`` high each cycle with ``probability`` (1 at
        first), drawn from random numbers seeded with ``seed``."""
        s = self._stream(self._outputs, prefix)
        self._lib.hs_ready(self._live, s.index, _probability(probability), seed)

    def set_idle(self, prefix, probability, seed=0):
        """Before each transfer on input ``prefix``, idle a cycle with ``probability``
        (repeatedly; 0 at first)."""
        s = self._stream(self._inputs, prefix)
        self._lib.hs_idle(self._live, s.index, _probability(probability), seed)

    # The PHY.

    def send_frame(self, frame, *, bad_fcs=False, pad=True):
        """Queue an Ethernet frame (destination MAC first, no FCS) into the MAC's RX pins,
        padded with zeros to 60 bytes unless ``pad`` is false, with a corrupted FCS if
        ``bad_fcs``. Frames follow each other with the minimum gap."""
        self._need_phy()
        frame = bytes(frame)
        if pad and len(frame) < MIN_FRAME:
            frame += bytes(MIN_FRAME - len(frame))
        self._lib.hs_send_frame(self._live, frame, len(frame), int(bad_fcs))

    def frames(self):
        """The frames the MAC sent since the last call, FCS stripped, as
        :class:`~iwarp_tb.beats.Packet` with ``err`` set for a bad FCS, a PHY error (``tx_er``,
        /E/, a control character other than /T/ ending the frame) or a bad preamble; the reasons
        are in ``packet.reasons`` and the cycle its last byte left in ``packet.cycle``."""
        self._need_phy()
        size = self._lib.hs_frames_size(self._live)
        buf = ctypes.create_string_buffer(size)
        self._lib.hs_take_frames(self._live, buf)
        return _frame_records(buf.raw)

    def tap_frames(self, tap):
        """The frames tap ``tap`` saw since the last call, as :meth:`frames` gives them."""
        if tap not in self.taps:
            raise KeyError(f"{self.name} has no tap {tap!r} (taps: {', '.join(self.taps)})")
        k = list(self.taps).index(tap)
        size = self._lib.hs_tap_frames_size(self._live, k)
        buf = ctypes.create_string_buffer(size)
        self._lib.hs_take_tap_frames(self._live, k, buf)
        return _frame_records(buf.raw)

    def _need_phy(self):
        if self.phy is None:
            raise RuntimeError(f"{self.name}: made without a phy")

    # AXI ports.

    def memory(self, prefix="m_axi"):
        """The :class:`HostMemory` on AXI4 manager port ``prefix`` (the same object each
        call)."""
        if prefix not in self._memories:
            raise KeyError(f"{self.name} has no AXI4 manager port {prefix!r} "
                           f"(ports: {', '.join(self._memories)})")
        return self._memories[prefix]

    def registers(self, prefix="s_axil"):
        """The :class:`RegisterPort` on AXI4-Lite subordinate port ``prefix``."""
        if prefix not in self._registers:
            raise KeyError(f"{self.name} has no AXI4-Lite subordinate port {prefix!r} "
                           f"(ports: {', '.join(self._registers)})")
        return self._registers[prefix]

    # The clock.

    def run(self, cycles, *, until_output=False):
        """Run up to ``cycles`` clock cycles; with ``until_output``, return after the first
        cycle in which something came out (a packet's last beat or a transfer of a struct
        stream on an output stream, or the end of a frame on the PHY). Returns the cycles run."""
        return self._lib.hs_run(self._live, cycles, int(until_output))

    @property
    def cycle(self):
        """Cycles run since reset."""
        return self._lib.hs_cycle(self._live)

    def tracing(self, on):
        """Record the cycles run from now on in the waveform (``on``) or not; it records
        from the start. The waveform's time stays the cycle count, so a pause is a gap."""
        self._lib.hs_trace(self._live, int(on))

    @property
    def time_ns(self):
        """:attr:`cycle` in nanoseconds at :attr:`clock_mhz`."""
        return self.cycle * 1000 / self.clock_mhz

    @property
    def _live(self):
        """The simulation's handle; :exc:`RuntimeError` once :meth:`close` has run."""
        if not self._h:
            raise RuntimeError(f"{self.name}: the harness is closed (read results before close)")
        return self._h

    def close(self):
        """Finish the simulation (and the waveform); the harness can't run after this."""
        if self._h:
            self._lib.hs_free(self._h)
            self._h = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        if getattr(self, "_h", None):
            self.close()


class HostMemory:
    """The host memory on one AXI4 manager port of a :class:`Harness` (:meth:`Harness.memory`):
    ``size`` bytes from address 0, answered by ``harness.cpp``'s ``HostMemory``.

    It serves full-width INCR bursts (1 to 256 beats, starting at any address, IDs echoed), and
    takes up to 64 write and 64 read bursts before it stops taking more (W beats are taken
    only after their burst's AW). Reads are answered in the order they were taken, and so are
    writes; :meth:`configure` sets the latency and random stalls.

    Protocol faults (:meth:`faults`): a burst that is not INCR, not full width, crosses a 4 KiB
    boundary or reaches beyond the memory; a W beat with ``wlast`` wrong or a strobe below an
    unaligned start address; a valid withdrawn, or a payload changed, before its ready. Such a
    burst writes nothing and reads zeros, and is answered DECERR if it reaches beyond the
    memory, else SLVERR; the simulation goes on.

    The shadow check (:meth:`allow`, :meth:`violations`): no byte is writable at first. A good
    write burst writes its strobed bytes that are writable and drops the others (the memory
    keeps its old value there, and the response is still OKAY); a burst with any such stray
    byte is a violation.
    """

    def __init__(self, harness, group, size):
        self._harness, self._index = harness, group.index
        self.prefix, self.data_bytes, self.size = group.prefix, group.data_bytes, size

    def _call(self, fn, *args):
        return getattr(self._harness._lib, fn)(self._harness._live, self._index, *args)

    def _span(self, addr, n):
        if not (0 <= addr and 0 <= n and addr + n <= self.size):
            raise ValueError(f"{self.prefix}: {n} bytes at {addr:#x} are not inside the "
                             f"{self.size:#x}-byte memory")

    def write(self, addr, data):
        """Store ``data`` at ``addr`` from the host side (not a bus access: not checked, not
        counted)."""
        data = bytes(data)
        self._span(addr, len(data))
        if data:
            self._call("hs_mem_write", addr, data, len(data))

    def read(self, addr, n):
        """``n`` bytes at ``addr``, read from the host side."""
        self._span(addr, n)
        buf = ctypes.create_string_buffer(n)
        if n:
            self._call("hs_mem_read", addr, buf, n)
        return buf.raw

    def allow(self, addr, n, writable=True):
        """Mark the ``n`` bytes at ``addr`` writable by the module (or not) for the shadow
        check."""
        self._span(addr, n)
        if n:
            self._call("hs_mem_allow", addr, n, int(writable))

    def configure(self, *, latency=0, stall=0.0, seed=0):
        """Answer each read's first beat ``latency`` + 1 cycles after its address is taken at
        the earliest, and each write ``latency`` + 1 cycles after its last data beat (0: the
        next cycle); with probability ``stall`` per cycle, drop each of ``awready``, ``wready``
        and ``arready`` and hold back a B or R transfer not yet offered, drawn from random
        numbers seeded with ``seed``."""
        if not isinstance(latency, int) or latency < 0:
            raise ValueError(f"latency must be a non-negative integer, not {latency!r}")
        self._call("hs_mem_configure", latency, _probability(stall), seed)

    def violations(self):
        """``(addr, length, cycle)`` of each write burst that strobed bytes outside writable
        memory, since the start (the first 64; ``stats()["violations"]`` counts them all):
        ``addr`` its first stray byte, ``length`` the span from there to its last, ``cycle`` that
        of its last data beat."""
        buf = (ctypes.c_uint64 * (3 * _MAX_RECORDS))()
        count = self._call("hs_mem_violations", buf, _MAX_RECORDS)
        return [tuple(buf[3 * k:3 * k + 3]) for k in range(count)]

    def faults(self):
        """The protocol faults since the start, each a line of text beginning with its cycle
        (the first 64; ``stats()["faults"]`` counts them all)."""
        buf = ctypes.create_string_buffer(self._call("hs_mem_faults_size"))
        self._call("hs_mem_faults", buf)
        return buf.raw.decode().splitlines()

    def stats(self):
        """Counters since the start: ``read_bursts`` (address transfers taken),
        ``write_bursts`` (bursts whose data is all in), ``read_bytes`` (data bytes of R
        transfers answered OKAY), ``write_bytes`` (bytes written), ``violations`` and
        ``faults``."""
        buf = (ctypes.c_uint64 * len(_STATS))()
        self._call("hs_mem_stats", buf)
        return dict(zip(_STATS, buf))


class RegisterError(Exception):
    """A register access answered with a response other than OKAY: ``addr``, ``resp`` (2
    SLVERR, 3 DECERR, ...) and ``kind`` ("read" or "write")."""

    def __init__(self, prefix, kind, addr, resp):
        super().__init__(f"{prefix}: register {kind} at {addr:#x} answered {_RESPONSES[resp]}")
        self.kind, self.addr, self.resp = kind, addr, resp


class RegisterPort:
    """An AXI4-Lite manager on one subordinate port of a :class:`Harness`
    (:meth:`Harness.registers`): one access at a time, each running the clock (everything
    else in the simulation runs too) until its response arrives.

    A write offers its address and data together with every strobe set; ``bready`` and
    ``rready`` are high only while a response is awaited. An access that timed out stays on the
    bus (AXI does not allow withdrawing it): the next access first waits, within its own
    timeout, for that one's response, which is dropped.
    """

    def __init__(self, harness, group):
        self._harness, self._index = harness, group.index
        self.prefix, self.data_bytes, self.addr_width = (group.prefix, group.data_bytes,
                                                          group.addr_width)

    def _check(self, addr, value=0):
        if not 0 <= addr < 1 << self.addr_width:
            raise ValueError(f"{self.prefix}: address {addr:#x} does not fit "
                             f"{self.addr_width} bits")
        if not 0 <= value < 1 << 8 * self.data_bytes:
            raise ValueError(f"{self.prefix}: {value:#x} does not fit {8 * self.data_bytes} "
                             f"bits")

    def _answer(self, kind, addr, resp, timeout):
        if resp < 0:
            raise TimeoutError(f"{self.prefix}: no response to the register {kind} at "
                               f"{addr:#x} in {timeout} cycles")
        if resp:
            raise RegisterError(self.prefix, kind, addr, resp)

    def write(self, addr, value, *, timeout=10_000):
        """Write ``value`` at ``addr``; :exc:`RegisterError` unless the response is OKAY,
        :exc:`TimeoutError` if none came within ``timeout`` cycles."""
        self._check(addr, value)
        h = self._harness
        resp = h._lib.hs_reg_write(h._live, self._index, addr, value, timeout)
        self._answer("write", addr, resp, timeout)

    def read(self, addr, *, timeout=10_000):
        """The value at ``addr``; :exc:`RegisterError` unless the response is OKAY,
        :exc:`TimeoutError` if none came within ``timeout`` cycles."""
        self._check(addr)
        h, value = self._harness, ctypes.c_uint64()
        resp = h._lib.hs_reg_read(h._live, self._index, addr, timeout, ctypes.byref(value))
        self._answer("read", addr, resp, timeout)
        return value.value


def pack(layout, fields=None, **more):
    """The ``tdata`` of a struct stream whose payload has ``layout`` (an Amaranth
    ``data.StructLayout``, first member in the least significant bits): ``fields`` by name (a
    dict and/or keywords; a dict again for a member that is a struct, an enum member or its
    value for an enum); members left out are zero."""
    layout = data.Layout.cast(layout)
    fields = {**(fields or {}), **more}
    unknown = set(fields) - {name for name, _ in layout}
    if unknown:
        raise KeyError(f"no member {sorted(unknown)} in {layout}")
    value = 0
    for name, member in layout:
        v = fields.get(name, 0)
        if isinstance(v, dict):
            v = pack(member.shape, v)
        elif isinstance(v, enum.Enum):
            v = v.value
        if not 0 <= v < 1 << member.width:
            raise ValueError(f"{name} is {member.width} bits wide: {v:#x} does not fit")
        value |= v << member.offset
    return value


def unpack(layout, value):
    """The members of ``value`` (a struct stream's ``tdata``) by name: :func:`pack` reversed,
    with enum members for enum-shaped members."""
    fields = {}
    for name, member in data.Layout.cast(layout):
        v = value >> member.offset & ((1 << member.width) - 1)
        if isinstance(member.shape, data.Layout):
            v = unpack(member.shape, v)
        elif isinstance(member.shape, enum.EnumMeta):
            v = member.shape(v)
        fields[name] = v
    return fields


def _frame_records(raw):
    """The frames of harness.cpp's records: ``{u64 cycle; u32 length; u8 flags; u8
    frame[length]}`` each."""
    size, frames, at = len(raw), [], 0
    while at < size:
        cycle = int.from_bytes(raw[at:at + 8], "little")
        length = int.from_bytes(raw[at + 8:at + 12], "little")
        flags = raw[at + 12]
        frame = Packet(raw[at + 13:at + 13 + length], bool(flags))
        frame.reasons = [text for bit, text in _FLAG_NAMES.items() if flags & bit]
        frame.cycle = cycle
        frames.append(frame)
        at += 13 + length
    return frames


def _load(path, phy, line):
    lib = ctypes.CDLL(str(path))
    p, u64, i = ctypes.c_void_p, ctypes.c_uint64, ctypes.c_int
    buf = ctypes.c_char_p
    signatures = {
        "hs_new": (p, [u64, buf, u64, u64]),
        "hs_free": (None, [p]),
        "hs_run": (u64, [p, u64, i]),
        "hs_cycle": (u64, [p]),
        "hs_trace": (None, [p, i]),
        "hs_set": (None, [p, i, buf]),
        "hs_get": (None, [p, i, buf]),
        "hs_push": (None, [p, i, u64, buf, buf, buf, buf]),
        "hs_pending": (u64, [p, i]),
        "hs_out_count": (u64, [p, i]),
        "hs_pull": (None, [p, i, buf, ctypes.POINTER(u64), buf, buf]),
        "hs_ready": (None, [p, i, u64, u64]),
        "hs_idle": (None, [p, i, u64, u64]),
        "hs_mem_write": (None, [p, i, u64, buf, u64]),
        "hs_mem_read": (None, [p, i, u64, buf, u64]),
        "hs_mem_allow": (None, [p, i, u64, u64, i]),
        "hs_mem_configure": (None, [p, i, u64, u64, u64]),
        "hs_mem_stats": (None, [p, i, ctypes.POINTER(u64)]),
        "hs_mem_violations": (u64, [p, i, ctypes.POINTER(u64), u64]),
        "hs_mem_faults_size": (u64, [p, i]),
        "hs_mem_faults": (None, [p, i, buf]),
        "hs_reg_write": (i, [p, i, u64, u64, u64]),
        "hs_reg_read": (i, [p, i, u64, u64, ctypes.POINTER(u64)]),
    }
    if phy:
        signatures.update({
            "hs_send_frame": (None, [p, buf, ctypes.c_uint32, i]),
            "hs_frames_size": (u64, [p]),
            "hs_take_frames": (None, [p, buf]),
        })
    if line:
        signatures.update({
            "hs_tap_frames_size": (u64, [p, i]),
            "hs_take_tap_frames": (None, [p, i, buf]),
        })
    for fn, (restype, argtypes) in signatures.items():
        getattr(lib, fn).restype = restype
        getattr(lib, fn).argtypes = argtypes
    return lib
