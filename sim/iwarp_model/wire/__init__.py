"""Wire codecs: bytes <-> dataclasses for every header and frame the stack puts on the wire.

Network byte order throughout (``struct`` formats with ``!``). A decoder given bad bytes raises
a specific exception naming what is wrong; it never returns a half-parsed object.
"""
