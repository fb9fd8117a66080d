# Owns the exceptions of the tunecache package: RpcError (a failed daemon call, with grpcio's
# code()/details()), StatusCode, the refusals of an untrusted socket or daemon, and
# ArtifactError (an artifact the client refused). The native
# module (src/errors.rs) raises them, filled from the Rust client's structured errors.
"""Exceptions raised by the tunecache package."""

from __future__ import annotations

import sys
from typing import Any, Optional


class UntrustedSocketError(ConnectionError):
    """The default socket path is in a place another local user could have planted it."""


class UntrustedDaemonError(UntrustedSocketError):
    """The daemon answering on the socket runs as a uid the caller does not trust."""


class ArtifactError(ValueError):
    """An artifact the client refused: a name or digest the contract does not allow, or bytes
    the daemon sent that are not the blob named (nothing of them is kept). The rules are the
    Rust client's (tunecache_proto::artifact)."""


class StatusCode:
    """gRPC status codes: ``StatusCode.INVALID_ARGUMENT`` and the others, each with ``name`` and
    ``value`` as grpcio's ``grpc.StatusCode`` has them (``(number, text)``). A code equals
    grpcio's member of the same name, so code written against grpcio compares as before. (Plain
    attributes, not an Enum: making an Enum class costs every rank process's import more than
    the rest of the package's Python.)"""

    __slots__ = ("name", "value")

    def __init__(self, name: str, value: tuple):
        self.name = name
        self.value = value

    def __eq__(self, other: Any) -> bool:
        if isinstance(other, StatusCode):
            return self is other
        # grpc.StatusCode, without importing grpcio: an Enum member of the same name and value.
        return getattr(other, "name", None) == self.name and getattr(other, "value", None) == self.value

    def __hash__(self) -> int:
        return hash(self.name)

    def __repr__(self) -> str:
        return f"StatusCode.{self.name}"


_CODE_NAMES = (
    "OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
    "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED",
    "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED",
)
_BY_NUMBER = {}
for _number, _name in enumerate(_CODE_NAMES):
    _BY_NUMBER[_number] = StatusCode(_name, (_number, _name.lower().replace("_", " ")))
    setattr(StatusCode, _name, _BY_NUMBER[_number])
del _number, _name


class RpcError(Exception):
    """A daemon call failed: ``code()`` (a StatusCode; grpcio's own member when grpcio is
    imported in the process) and ``details()`` (the daemon's message), as grpcio's errors have
    them. ``refused_entry_index``: for a Record refused as INVALID_ARGUMENT, the index of the
    entry the daemon named in its BadRequest detail, else None.

    When grpcio is imported in the process, the error raised is also a ``grpc.RpcError`` (a
    subclass made then), so ``except grpc.RpcError`` around package calls keeps working; code
    that names grpc.RpcError has imported grpcio, so this costs the package no import of it."""

    def __init__(self, code: "StatusCode", details: str, refused_entry_index: Optional[int] = None):
        super().__init__(f"{code.name}: {details}")
        self._code = code
        self._details = details
        self.refused_entry_index = refused_entry_index

    def code(self) -> Any:
        grpc = sys.modules.get("grpc")
        grpc_codes = getattr(grpc, "StatusCode", None)
        if grpc_codes is not None:
            return getattr(grpc_codes, self._code.name, self._code)
        return self._code

    def details(self) -> str:
        return self._details

    def trailing_metadata(self) -> tuple:
        return ()

    def initial_metadata(self) -> tuple:
        return ()

    def debug_error_string(self) -> str:
        return str(self)


_grpc_compatible: dict = {}


def _rpc_error_class() -> type:
    grpc = sys.modules.get("grpc")
    base = getattr(grpc, "RpcError", None)
    if not isinstance(base, type) or not issubclass(base, BaseException):
        return RpcError
    compatible = _grpc_compatible.get(base)
    if compatible is None:
        compatible = type("RpcError", (RpcError, base), {"__module__": __name__, "__doc__": RpcError.__doc__})
        _grpc_compatible[base] = compatible
    return compatible


def _rpc_error(number: int, details: str, refused_entry_index: Optional[int]) -> RpcError:
    """Made by the native module for each failed call."""
    code = _BY_NUMBER.get(number, StatusCode.UNKNOWN)
    return _rpc_error_class()(code, details, refused_entry_index)
