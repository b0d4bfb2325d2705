"""Linux soft-iWARP (``siw``) as a real peer, in a QEMU guest built from Debian packages.

- :mod:`iwarp_tb.siw.image` builds the guest (kernel, out-of-tree ``siw.ko`` variants, initramfs)
  into ``build/siw`` and caches it.
- :mod:`iwarp_tb.siw.guest` boots it (:class:`SiwGuest`, :func:`run_pair`) and parses its result.
- :mod:`iwarp_tb.siw.netdev` is the host's end of the guest's wire (:class:`SocketNetdev`).
- :mod:`iwarp_tb.siw.modelpeer` puts the reference model on that wire (:class:`ModelPeer`) and
  reassembles the recorded TCP streams into MPA frames and FPDUs (:func:`tcp_streams`).
- :mod:`iwarp_tb.siw.nicpeer` puts a Verilated NicCore on it (:class:`NicPeer`), driven
  through the verbs driver; :mod:`iwarp_tb.siw.matrix` writes the interop matrix.

The names below are imported on first use, so ``python -m iwarp_tb.siw.guest`` runs cleanly.
See README.md in this folder.
"""

import importlib

_NAMES = {
    "GuestError": "guest", "GuestResult": "guest", "SiwGuest": "guest", "free_port": "guest",
    "run_pair": "guest", "VARIANTS": "image", "BuildError": "image", "ensure": "image",
    "SocketNetdev": "netdev", "ModelPeer": "modelpeer", "tcp_streams": "modelpeer",
}
__all__ = sorted(_NAMES)


def __getattr__(name):
    if name in _NAMES:
        return getattr(importlib.import_module(f"{__name__}.{_NAMES[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
