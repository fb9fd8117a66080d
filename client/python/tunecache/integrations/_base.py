# Owns what every drop-in (and tunecache.autotune) shares, so that none writes it again: this
# process's daemon client and its one warning (Daemon), the tune-once dispatch over the Rust
# client's split lease (Daemon.tune_once: use a hit, tune here under the lease and Record, wait
# for another process's result, or fall back to the framework's own code), its steps (begin,
# finish, give_up) for a framework that tunes between two calls of its own (Triton), whether the
# client replays (replaying: TUNECACHE_MODE=replay, issue 52), the drop-ins' millisecond settings
# (env_ms) and the provenance text every result carries (tuned_by).
# tests/test_dropin_structure.py fails when a drop-in defines its own.
"""The base every tunecache drop-in is built on (``tunecache.integrations._base``).

A drop-in makes one ``Daemon`` per process with the words of its one warning, and asks it:

* ``client()``: this process's client, made on first use (``DaemonUnreachable`` when none can
  be: an untrusted socket, say);
* ``warn_once(what, problem)``: the first problem in the process at WARNING, the rest at DEBUG;
* ``through_daemon(what, work)``: runs ``work()``, which uses the daemon; False (warned) when the
  daemon could not be used, and the patched method runs the framework's own;
* ``tune_once(key, ...)``: Resolve ``key``; on a hit, ``hit(result)``; when this process holds
  the lease, ``tune()`` (answering ``(answer, result)``), whose result is Recorded under the
  lease (a ``tune()`` that raises, or answers no result, gives the lease up); another process's
  lease: the daemon holds the Resolve until its result comes (``rounds`` Resolves at most);
  else ``fall_back(reason)``. What the Rust client's ``finish_tune`` decides for a failed Record
  (give the lease up, or keep it past a deadline) holds for every drop-in;
* ``replaying()``: whether the client replays (``TUNECACHE_MODE=replay``, see
  ``tunecache.Client``). Then every Resolve is a hit or a miss at once, never a wait nor a lease
  (the Rust client's rule, whatever ``begin`` asks), the miss logged once per key by the Rust
  client (logger ``tunecache.replay``) and counted by the daemon; ``tune_once`` then falls back
  at the first miss, and a drop-in's ``fall_back`` does its framework's own no-cache behaviour
  (its default, never its tuner where the framework would not tune without a cache), with no
  warning of its own.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any, Callable, Optional

from tunecache.client import DEFAULT_TIMEOUT_S, Client, describe_key, describe_problem, tuned_by
from tunecache.errors import RpcError, UntrustedSocketError

__all__ = ["Daemon", "DaemonUnreachable", "env_ms", "tuned_by"]

# The daemon calls whose failures Daemon.report hears of, named as the Rust rank flow names them.
RESOLVE = "Resolve"
RECORD = "Record"
GIVE_UP = "Record (giving the lease up)"


class DaemonUnreachable(Exception):
    """The daemon cannot be used for this call; the framework's own code runs instead."""


def env_ms(name: str, default: int) -> int:
    """Milliseconds from the environment variable ``name``: a whole number, a negative one
    being 0; ``default`` when it is unset, empty or no number."""
    try:
        return max(0, int(os.environ.get(name, "") or default))
    except ValueError:
        return default


class Daemon:
    """This process's client of the daemon for one drop-in, made on first use, and its one
    warning: a model never fails because of its cache, and the log never floods. The client is
    fork-safe; the warning is once per process, a forked child's own.

    ``warning`` (the first problem, at WARNING) and ``later`` (the others, at DEBUG) are
    %-templates of ``socket``, ``what`` and ``problem``. ``connect`` makes the client (default:
    ``Client(socket, timeout=timeout)``)."""

    def __init__(
        self,
        logger: logging.Logger,
        warning: str,
        later: str,
        socket: Any = None,
        timeout: float = DEFAULT_TIMEOUT_S,
        connect: Optional[Callable[[], Client]] = None,
    ):
        self.logger = logger
        self.warning = warning
        self.later = later
        self.socket = socket
        self.timeout = timeout
        self._connect = connect
        self._lock = threading.Lock()
        self._client: Optional[Client] = None
        self._warned_pid: Optional[int] = None

    def client(self) -> Client:
        """This process's client; DaemonUnreachable when it cannot be made (the socket is not
        trusted, say). A failed attempt is tried again by the next call."""
        with self._lock:
            if self._client is None:
                try:
                    self._client = self._connect() if self._connect else Client(self.socket, timeout=self.timeout)
                except (UntrustedSocketError, OSError, ValueError) as err:
                    raise DaemonUnreachable(str(err)) from err
            return self._client

    def replaying(self) -> bool:
        """Whether this process's client replays (serves only what is cached; see the module
        doc). False when no client can be made: the framework's own code runs anyway."""
        try:
            return self.client().mode == "replay"
        except DaemonUnreachable:
            return False

    @property
    def socket_path(self) -> str:
        if self._client is not None:
            return self._client.socket_path
        return os.fspath(self.socket) if self.socket is not None else "default socket"

    def warn_once(self, what: str, problem: Any) -> None:
        fields = {"socket": self.socket_path, "what": what, "problem": describe_problem(problem)}
        with self._lock:
            first = self._warned_pid != os.getpid()
            self._warned_pid = os.getpid()
        if first:
            self.logger.warning("tunecache: " + self.warning, fields)
        else:
            self.logger.debug("tunecache: " + self.later, fields)

    def through_daemon(self, what: str, work: Callable[[], Any]) -> bool:
        """Runs ``work()``, a patched method's work through the daemon: True when done; False,
        with the one warning, when the daemon could not be used (the caller then runs the
        framework's own method)."""
        try:
            work()
            return True
        except (DaemonUnreachable, RpcError) as err:
            self.warn_once(what, err)
            return False

    def report(self, call: str, problem: Any, what: Any) -> None:
        """A daemon call that failed (``call``: RESOLVE, RECORD or GIVE_UP), in a tuning that
        the caller names ``what``: the one warning; a lease not given up only at DEBUG (it
        expires, or ends with the process)."""
        if call == GIVE_UP:
            self.logger.debug("tunecache: could not give the lease up (%s); it expires", problem)
        else:
            self.warn_once(what, problem)

    # --- the split lease, every failure reported ------------------------------------------------

    def begin(self, key: Any, *, wait_ms: int, lease_ms: int, what: Any) -> Any:
        """Resolves ``key`` (``begin_tune``, can tune; in replay the Rust client sends it
        without a wait or a lease): a TuneStart, or None when the daemon cannot be asked
        (reported)."""
        try:
            return self.client().begin_tune(key, wait_ms=wait_ms, can_tune=True, lease_ms=lease_ms)
        except (DaemonUnreachable, RpcError) as err:
            self.report(RESOLVE, err, what)
            return None

    def finish(self, lease: Any, result: Any, *, what: Any, refused: Optional[Callable[[Any], None]] = None,
               also: Any = ()) -> bool:
        """Records ``result`` under ``lease`` (``finish_tune``); True when Recorded. The
        daemon's refusal of the result itself (INVALID_ARGUMENT) is ``refused(error)``'s to
        say (default: reported as any other failure). ``also``: entries Recorded in the same
        Record, for a lease that stands for several keys."""
        try:
            finished = self.client().finish_tune(lease, result, also=list(also))
        except Exception as err:  # could not even reach the daemon; the lease ends with us
            self.report(RECORD, err, what)
            return False
        if finished.error is None:
            return True
        if finished.refused and refused is not None:
            refused(finished.error)
        else:
            self.report(RECORD, finished.error, what)
        if finished.give_up_error is not None:
            self.report(GIVE_UP, finished.give_up_error, what)
        return False

    def give_up(self, lease: Any, what: Any = None) -> None:
        """Gives ``lease`` up (``abandon``): a waiter tunes at once. Never raises."""
        try:
            self.client().abandon(lease)
        except Exception as err:
            self.report(GIVE_UP, err, what)

    # --- the tune-once dispatch ------------------------------------------------------------------

    def tune_once(
        self,
        key: Any,
        *,
        wait_ms: int,
        lease_ms: int,
        what: Any,
        hit: Callable[[Any], Any],
        tune: Callable[[], Any],
        fall_back: Callable[[Optional[str]], Any],
        refused: Optional[Callable[[Any], None]] = None,
        recorded: Optional[Callable[[], None]] = None,
        rounds: int = 1,
    ) -> Any:
        """Tunes ``key`` once among every process that asks (see the module doc); answers what
        ``hit``, ``tune`` or ``fall_back`` answered. ``fall_back(None)``: the daemon could not
        be asked (reported); ``fall_back(reason)``: no result within ``rounds`` waits.
        ``recorded()`` runs once the tuned result is Recorded; ``refused`` as in ``finish``."""
        reason = ""
        for round_ in range(rounds):
            start = self.begin(key, wait_ms=wait_ms, lease_ms=lease_ms, what=what)
            if start is None:
                return fall_back(None)
            if start.kind == "hit":
                return hit(start.result)
            if start.kind == "tune":
                return self._tune_under(start.lease, tune, what, refused, recorded)
            # A miss: the wait ran out (the tuner is slow) or its lease was given up; in replay,
            # not cached, and asking again would only miss again.
            reason = start.reason
            if self.replaying():
                break
            if round_ + 1 < rounds:
                self.logger.debug("tunecache: %s: %s; resolving again", describe_key(key), reason)
        return fall_back(reason)

    def _tune_under(self, lease: Any, tune: Callable[[], Any], what: Any,
                    refused: Optional[Callable[[Any], None]], recorded: Optional[Callable[[], None]]) -> Any:
        try:
            answer, result = tune()
        except BaseException:
            self.give_up(lease, what)
            raise
        if result is None:  # nothing to Record (tune said why)
            self.give_up(lease, what)
        elif self.finish(lease, result, what=what, refused=refused) and recorded is not None:
            recorded()
        return answer
