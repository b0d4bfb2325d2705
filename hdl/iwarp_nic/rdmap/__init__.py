"""RDMAP (RFC 5040, RFC 7306): the Terminate message."""

from .terminate import TerminateEmitter, TerminateRequest

__all__ = ["TerminateEmitter", "TerminateRequest"]
