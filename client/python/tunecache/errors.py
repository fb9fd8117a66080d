# Owns the exceptions of the tunecache package: RpcError (a failed daemon call, with grpcio's
# code()/details()), StatusCode, and the refusals of an untrusted socket or daemon. The native
# module (src/errors.rs) raises them, filled from the Rust client's structured errors.
"""Exceptions raised by the tunecache package."""

from __future__ import annotations

import enum
import sys
from typing import Any, Optional


class UntrustedSocketError(ConnectionError):
    """The default socket path is in a place another local user could have planted it."""


class UntrustedDaemonError(UntrustedSocketError):
    """The daemon answering on the socket runs as a uid the caller does not trust."""


class StatusCode(enum.Enum):
    """gRPC status codes, valued as grpcio's ``grpc.StatusCode`` (``(number, name)``). A member
    equals grpcio's member of the same name, so code written against grpcio compares as before."""

    OK = (0, "ok")
    CANCELLED = (1, "cancelled")
    UNKNOWN = (2, "unknown")
    INVALID_ARGUMENT = (3, "invalid argument")
    DEADLINE_EXCEEDED = (4, "deadline exceeded")
    NOT_FOUND = (5, "not found")
    ALREADY_EXISTS = (6, "already exists")
    PERMISSION_DENIED = (7, "permission denied")
    RESOURCE_EXHAUSTED = (8, "resource exhausted")
    FAILED_PRECONDITION = (9, "failed precondition")
    ABORTED = (10, "aborted")
    OUT_OF_RANGE = (11, "out of range")
    UNIMPLEMENTED = (12, "unimplemented")
    INTERNAL = (13, "internal")
    UNAVAILABLE = (14, "unavailable")
    DATA_LOSS = (15, "data loss")
    UNAUTHENTICATED = (16, "unauthenticated")

    def __eq__(self, other: Any) -> bool:
        if isinstance(other, StatusCode):
            return self is other
        # grpc.StatusCode, without importing grpcio: an Enum of the same name and value.
        return isinstance(other, enum.Enum) and other.name == self.name and other.value == self.value

    def __hash__(self) -> int:
        return hash(self.name)


_BY_NUMBER = {member.value[0]: member for member in StatusCode}


class RpcError(Exception):
    """A daemon call failed: ``code()`` (a StatusCode; grpcio's own member when grpcio is
    imported in the process) and ``details()`` (the daemon's message), as grpcio's errors have
    them. ``refused_entry_index``: for a Record refused as INVALID_ARGUMENT, the index of the
    entry the daemon named in its BadRequest detail, else None.

    When grpcio is imported in the process, the error raised is also a ``grpc.RpcError`` (a
    subclass made then), so ``except grpc.RpcError`` around package calls keeps working; code
    that names grpc.RpcError has imported grpcio, so this costs the package no import of it."""

    def __init__(self, code: StatusCode, details: str, refused_entry_index: Optional[int] = None):
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
