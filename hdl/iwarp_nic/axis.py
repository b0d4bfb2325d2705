"""Top-level port naming: a component's streams as AXI-Stream ports of its Verilog module.

Generated modules attach unchanged to cocotbext-axi models and to other FPGA flows because every
stream member becomes a set of AXI-Stream ports:

========================  =============================================
component member          Verilog ports
========================  =============================================
``i`` (In stream)         ``s_axis_tvalid/tready/tdata[/tkeep/tlast/tuser]``
``o`` (Out stream)        ``m_axis_...``
``i_<x>`` / ``o_<x>``     ``s_axis_<x>_...`` / ``m_axis_<x>_...``
other streams             ``s_axis_<name>_...`` (In) / ``m_axis_<name>_...`` (Out)
plain signals             their own names (``drop``, ``status``, ...)
========================  =============================================

A beat payload (:func:`iwarp_nic.stream.BeatLayout`) maps ``data, keep, last, err`` to
``tdata, tkeep, tlast, tuser``; any other payload is packed whole into ``tdata`` (a struct
payload in Amaranth's order, first member in the least significant bits). Clock and reset are
``clk`` and ``rst``.
"""

from amaranth import Elaboratable, Module, Signal, Value
from amaranth.back import verilog
from amaranth.hdl import _ir
from amaranth.lib import stream, wiring

__all__ = ["AXIS_SUFFIX", "axis_prefix", "axi_ports", "AxiTop", "convert"]

AXIS_SUFFIX = {"data": "tdata", "keep": "tkeep", "last": "tlast", "err": "tuser"}


def axis_prefix(name, flow):
    """The AXI-Stream port prefix of stream member ``name`` with ``flow`` (In or Out)."""
    side = "s_axis" if flow == wiring.In else "m_axis"
    for short in ("i", "o"):
        if name == short:
            return side
        if name.startswith(short + "_"):
            return f"{side}_{name[2:]}"
    return f"{side}_{name}"


def _is_beat(layout):
    names = set(getattr(layout, "members", {}))
    return {"data", "keep", "last"} <= names <= set(AXIS_SUFFIX)


def axi_ports(component):
    """``{port_name: (value, direction)}`` for ``verilog.convert(..., ports=...)``."""
    ports = {}
    streams = {name: member for name, member in component.signature.members.items()
               if member.is_signature and isinstance(member.signature, stream.Signature)}
    for path, member, value in component.signature.flatten(component):
        direction = (_ir.PortDirection.Input if member.flow == wiring.In
                     else _ir.PortDirection.Output)
        if path[0] in streams and len(path) == 2:
            prefix = axis_prefix(path[0], streams[path[0]].flow)
            if path[1] == "payload":
                layout = streams[path[0]].signature.members["payload"].shape
                if _is_beat(layout):
                    for field, _ in layout:
                        ports[f"{prefix}_{AXIS_SUFFIX[field]}"] = (Value.cast(value[field]),
                                                                  direction)
                else:
                    ports[f"{prefix}_tdata"] = (Value.cast(value), direction)
            else:
                ports[f"{prefix}_t{path[1]}"] = (Value.cast(value), direction)
        else:
            ports["_".join(map(str, path))] = (Value.cast(value), direction)
    return ports


class AxiTop(Elaboratable):
    """Wraps a component so its ports are plain signals with the AXI names of :func:`axi_ports`.

    ``ports`` is the ``{name: (signal, direction)}`` dict to give ``verilog.convert``.
    """

    def __init__(self, component):
        self.component = component
        self.ports = {}
        self._links = []
        for name, (value, direction) in axi_ports(component).items():
            pin = Signal(len(value), name=name)
            self.ports[name] = (pin, direction)
            self._links.append((value, pin, direction))

    def elaborate(self, platform):
        m = Module()
        m.submodules.core = self.component
        for value, pin, direction in self._links:
            if direction == _ir.PortDirection.Input:
                m.d.comb += value.eq(pin)
            else:
                m.d.comb += pin.eq(value)
        return m


def convert(component, name):
    """Verilog text of ``component`` as module ``name`` with AXI-named ports."""
    top = AxiTop(component)
    return verilog.convert(top, name=name, ports=top.ports, emit_src=False,
                           strip_internal_attrs=True)
