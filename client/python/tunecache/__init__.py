# Owns the public names of the `tunecache` Python package; the implementation is in client.py
# (the daemon client and get_or_tune), view.py (the view from the environment), autotuning.py
# (the generic tuning helper), integrations/ (framework drop-ins) and the generated stubs (from
# proto/tunecache/v1/tunecache.proto) in v1/.
"""Python client for tunecached, the per-node GPU autotuning cache daemon."""

from tunecache.client import (
    CHANNEL_OPTIONS,
    DEFAULT_TIMEOUT_S,
    DEFAULT_WAIT_MS,
    SOCKET_ENV,
    TRUST_UID_ENV,
    Client,
    Entry,
    Key,
    Result,
    UntrustedDaemonError,
    UntrustedSocketError,
    check_daemon_uid,
    check_default_socket,
    default_socket_path,
    describe_key,
    get_or_tune,
    refused_entry_index,
)
from tunecache.autotuning import Autotuner, autotune
from tunecache.view import VIEW_ENV, resolve_view

__all__ = [
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
