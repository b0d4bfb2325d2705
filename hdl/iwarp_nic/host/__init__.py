"""The host interface: AXI4-Lite control/status registers (ARM IHI 0022, part B) generated from
one register-map description, which also gives the driver its offsets and C users a header."""

from .axil import AxiLiteManager, AxiLiteTarget, ReadDone, ReadRequest, WriteDone, WriteRequest
from .bank import PulseLayout, RegisterBank
from .cheader import c_header, descriptor_fields, write_header
from .regmap import PULSE, RO, RW, W1C, Field, Register, RegisterMap, Word

__all__ = ["AxiLiteTarget", "AxiLiteManager", "WriteRequest", "WriteDone", "ReadRequest",
           "ReadDone",
           "RegisterBank", "PulseLayout", "c_header", "write_header", "descriptor_fields",
           "RO", "RW", "W1C", "PULSE", "Field", "Register", "RegisterMap", "Word"]
