# Owns the public names of the `tunecache` Python package; the implementation is the native
# binding of the Rust client (tunecache._native, from client/python/src) under client.py (the
# daemon client and get_or_tune), autotuning.py (the generic tuning helper), integrations/
# (framework drop-ins) and errors.py. Importing it starts nothing and imports no grpcio; the
# generated gRPC stubs (tunecache.v1) are the `[grpc]` extra's, for code that wants raw gRPC.
"""Python client for tunecached, the per-node GPU autotuning cache daemon."""

from tunecache.client import (
    CHANNEL_OPTIONS,
    DEFAULT_TIMEOUT_S,
    DEFAULT_WAIT_MS,
    SOCKET_ENV,
    TRUST_UID_ENV,
    Artifact,
    ArtifactError,
    Client,
    Entry,
    Key,
    Result,
    ScanView,
    UntrustedDaemonError,
    UntrustedSocketError,
    check_daemon_uid,
    check_default_socket,
    default_socket_path,
    describe_key,
    get_or_tune,
    refused_entry_index,
)
from tunecache.errors import RpcError, StatusCode
from tunecache.view import VIEW_ENV, resolve_view

__all__ = [
    "Artifact",
    "ArtifactError",
    "Autotuner",
    "CHANNEL_OPTIONS",
    "DEFAULT_TIMEOUT_S",
    "DEFAULT_WAIT_MS",
    "SOCKET_ENV",
    "TRUST_UID_ENV",
    "VIEW_ENV",
    "Client",
    "Entry",
    "Key",
    "Result",
    "RpcError",
    "ScanView",
    "StatusCode",
    "UntrustedDaemonError",
    "UntrustedSocketError",
    "autotune",
    "check_daemon_uid",
    "check_default_socket",
    "default_socket_path",
    "describe_key",
    "get_or_tune",
    "refused_entry_index",
    "resolve_view",
]


def __getattr__(name):
    # The autotuning helper (statistics, functools, ...) loads on first use: a rank that only
    # uses Client or a drop-in never pays for its imports.
    if name in ("Autotuner", "autotune"):
        from tunecache import autotuning

        return getattr(autotuning, name)
    raise AttributeError(f"module 'tunecache' has no attribute {name!r}")
