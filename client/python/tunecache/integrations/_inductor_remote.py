# Owns the backend that serves Inductor's remote caches (RemoteAutotuneCache,
# RemoteBundledAutotuneCache, RemoteFxGraphCache, RemoteAOTAutogradCache, torch 2.15.0) from
# tunecached instead of a site Redis: their values kept as daemon entries, a large one as an
# artifact, and Redis (or nothing, as stock without Redis) when the daemon cannot be used.
# tunecache.integrations.inductor installs it with the rest of the drop-in.
"""Inductor's remote caches, served by tunecached.

Each class keeps its own key (``pt2:<cache id>::<key>:c1``, their salts and versions inside) as
the problem of an entry in namespace ``inductor.remote``, op the class's name. The value's bytes
are in the result's config (base64) up to ``INLINE_BYTES``; a larger value (a compiled graph) is
an artifact of the entry, stored once per node and fetched verified by digest. Their ``get`` and
``put`` are Lookups and Records: nothing here waits for another process.

``RemoteCache.backend_override_cls``, their hook for swapping a class's backend, is what is set,
so everything above the backend (their serde, key format, stats) stays theirs.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import logging
import os
import tempfile
import time
from typing import Any, Optional

from tunecache.client import Entry, Key, Result
from tunecache.integrations._base import Daemon, tuned_by

logger = logging.getLogger("tunecache.inductor")

NAMESPACE = "inductor.remote"
CACHE_CLASSES = ("RemoteAutotuneCache", "RemoteBundledAutotuneCache", "RemoteFxGraphCache", "RemoteAOTAutogradCache")
# Base64 of this many bytes stays well under the daemon's 64 KiB config bound.
INLINE_BYTES = 40 * 1024
ARTIFACT_NAME = "value"
TUNER = "inductor remote cache"


def _key(cache_class: str, key: str) -> Any:
    return Key(namespace=NAMESPACE, op=cache_class, device="", problem=key)


def patch(daemon: Daemon, module: Any) -> None:
    """Gives each remote cache class of ``module`` (``torch._inductor.remote_cache``) a daemon
    backend, unless something else (a test of theirs) already overrides it."""
    from tunecache.integrations import inductor

    backend_class = make_backend_class(daemon, module)
    for name in CACHE_CLASSES:
        cls = getattr(module, name, None)
        if cls is None or cls.__dict__.get("backend_override_cls") is not None:
            continue
        cls.backend_override_cls = functools.partial(backend_class, name)
        inductor._installed["undo"].append(lambda cls=cls: setattr(cls, "backend_override_cls", None))


def make_backend_class(daemon: Daemon, module: Any) -> type:
    class DaemonRemoteCacheBackend(module.RemoteCacheBackend):
        """One remote cache class's bytes in the daemon (see the module doc)."""

        def __init__(self, cache_class: str) -> None:
            super().__init__()
            self.cache_class = cache_class
            self._fallback: Any = None
            self._fallback_made = False

        def _stock(self) -> Any:
            """Their Redis backend, as stock would use it, or None (no Redis: no remote cache)."""
            if not self._fallback_made:
                self._fallback_made = True
                try:
                    self._fallback = module.RedisRemoteCacheBackend(self.cache_class)
                except Exception as err:  # noqa: BLE001 - stock create_cache gives up the same way
                    logger.debug("tunecache: no Redis backend for %s either: %s", self.cache_class, err)
            return self._fallback

        def _get(self, key: str) -> Optional[bytes]:
            found: list = []
            if daemon.through_daemon(f"reading Inductor's {self.cache_class}",
                                     lambda: found.extend(daemon.client().lookup([_key(self.cache_class, key)]))):
                return _value_of(daemon, found[0].result, key) if found else None
            stock = self._stock()
            return stock._get(key) if stock is not None else None

        def _put(self, key: str, data: bytes) -> None:
            if daemon.through_daemon(f"writing Inductor's {self.cache_class}",
                                     lambda: _record(daemon, _key(self.cache_class, key), bytes(data))):
                return
            stock = self._stock()
            if stock is not None:
                stock._put(key, data)

    return DaemonRemoteCacheBackend


def _record(daemon: Daemon, key: Any, data: bytes) -> None:
    digest = hashlib.sha256(data).hexdigest()
    config = {"bytes": len(data), "sha256": digest}
    artifacts: list = []
    client = daemon.client()
    if len(data) <= INLINE_BYTES:
        config["b64"] = base64.b64encode(data).decode("ascii")
    else:
        with tempfile.TemporaryDirectory(prefix="tunecache-inductor-") as directory:
            path = os.path.join(directory, ARTIFACT_NAME)
            with open(path, "wb") as file:
                file.write(data)
            artifacts = client.put_artifacts([(ARTIFACT_NAME, path)])
        config["artifact"] = ARTIFACT_NAME
    result = Result(
        config=json.dumps(config, sort_keys=True),
        time_us=0.0,
        tuned_by=tuned_by(TUNER),
        tuned_at_unix_ms=int(time.time() * 1000),
        artifacts=artifacts,
    )
    client.record([Entry(key=key, result=result)])


def _value_of(daemon: Daemon, result: Any, key: str) -> Optional[bytes]:
    """The bytes ``result`` holds, or None (a miss) when they are not to be had or do not match
    the digest recorded with them."""
    try:
        config = json.loads(result.config)
        size, digest = int(config["bytes"]), str(config["sha256"])
        if "b64" in config:
            data = base64.b64decode(config["b64"], validate=True)
        else:
            with tempfile.TemporaryDirectory(prefix="tunecache-inductor-") as directory:
                daemon.client().fetch_artifacts(result, directory)
                with open(os.path.join(directory, str(config["artifact"])), "rb") as file:
                    data = file.read(size + 1)
    except Exception as err:  # noqa: BLE001 - a value we cannot read is a miss: Inductor compiles
        daemon.warn_once(f"could not read the remote cache value {key}", err)
        return None
    if len(data) != size or hashlib.sha256(data).hexdigest() != digest:
        daemon.warn_once(f"the remote cache value {key}", "does not match its digest")
        return None
    return data
