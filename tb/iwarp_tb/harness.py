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

__all__ = ["Harness", "PHY_PINS", "pack", "unpack"]

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
        ``build/harness/<name>[-trace]/``).
    component : wiring.Component
        Its ports become the module's (:func:`iwarp_nic.axis.axi_ports`).
    phy : None, "gmii" or "xgmii"
        Attach a PHY model to the MAC pins of :data:`PHY_PINS` (which the module must have).
    trace : path or None
        Write a waveform of every cycle there (FST if :func:`toolchain.have_fst`, else VCD: the
        suffix is changed to match; see :attr:`trace`). Traced builds are slower.
    clock_mhz : float
        The clock the waveform and :attr:`time_ns` assume (by default from the PHY).
    seed : int
        Seeds the idle and stall draws of every stream.
    params : any
        What determines ``component`` besides the gateware sources (its ``repr`` is used):
        given, the Verilog is reused while neither changes (see
        :func:`~iwarp_tb.runner.write_verilog`).

    The module is reset for 4 cycles when the harness is made; :attr:`cycle` counts from there.
    Use as a context manager or call :meth:`close` (which finishes the waveform).
    """

    def __init__(self, name, component, *, phy=None, trace=None, clock_mhz=None, seed=0,
                 params=None):
        if phy not in (None, *PHY_PINS):
            raise ValueError(f"phy must be None, 'gmii' or 'xgmii', not {phy!r}")
        ports = {port: (len(value), direction)
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
        self._ports = {port: (index, width, direction.name == "Input")
                       for index, (port, (width, direction)) in enumerate(
                           (p, v) for p, v in ports.items() if p not in in_stream)}

        source = write_verilog(name, component, params=params)
        fst = trace is not None and toolchain.have_fst()
        self.trace = None if trace is None else Path(trace).with_suffix(".fst" if fst else ".vcd")
        build_dir = toolchain.BUILD / "harness" / (name + ("-trace" if trace else ""))
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
        library = verilate(name, [source, _HARNESS], build_dir, "harness.so",
                           headers=[*_HEADERS, glue], cflags=cflags, ldflags=["-shared"],
                           args=args)
        self._lib = _load(library, phy is not None)
        if self.trace is not None:
            self.trace.parent.mkdir(parents=True, exist_ok=True)
        period_ps = round(1e6 / self.clock_mhz)
        self._h = self._lib.hs_new(seed, None if self.trace is None else str(self.trace).encode(),
                                   period_ps)

    def _glue(self):
        """harness_glue.h: this module's ports for harness.cpp."""
        lines = [f"// Generated by iwarp_tb.harness for {self.name}: do not edit.", "#pragma once",
                 ""]
        if self.phy:
            lines += [f"#define HARNESS_PHY_{self.phy.upper()} 1", ""]
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
        lines += ["    default: (void)top; (void)bytes;", "    }", "}", "", "}  // namespace", ""]
        return "\n".join(lines)

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
        raw, frames, at = buf.raw, [], 0
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

    def _need_phy(self):
        if self.phy is None:
            raise RuntimeError(f"{self.name}: made without a phy")

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


def _load(path, phy):
    lib = ctypes.CDLL(str(path))
    p, u64, i = ctypes.c_void_p, ctypes.c_uint64, ctypes.c_int
    buf = ctypes.c_char_p
    signatures = {
        "hs_new": (p, [u64, buf, u64]),
        "hs_free": (None, [p]),
        "hs_run": (u64, [p, u64, i]),
        "hs_cycle": (u64, [p]),
        "hs_set": (None, [p, i, buf]),
        "hs_get": (None, [p, i, buf]),
        "hs_push": (None, [p, i, u64, buf, buf, buf, buf]),
        "hs_pending": (u64, [p, i]),
        "hs_out_count": (u64, [p, i]),
        "hs_pull": (None, [p, i, buf, ctypes.POINTER(u64), buf, buf]),
        "hs_ready": (None, [p, i, u64, u64]),
        "hs_idle": (None, [p, i, u64, u64]),
    }
    if phy:
        signatures.update({
            "hs_send_frame": (None, [p, buf, ctypes.c_uint32, i]),
            "hs_frames_size": (u64, [p]),
            "hs_take_frames": (None, [p, buf]),
        })
    for fn, (restype, argtypes) in signatures.items():
        getattr(lib, fn).restype = restype
        getattr(lib, fn).argtypes = argtypes
    return lib
