# Owns the pytest fixtures of the Python client tests: the import path of the in-tree package,
# the real `tunecached` daemon (started per test, stopped with SIGTERM; several, on one real
# `redis-server`, for the cluster tier). The tests import the installed package (the wheel
# run_tests.sh builds and installs, or `maturin develop`), never the source tree, which has no
# native module.
from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import socket as socketlib
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

PYTHON_PACKAGE_ROOT = Path(__file__).resolve().parents[1]  # client/python
REPO_ROOT = Path(__file__).resolve().parents[3]
import tunecache  # noqa: E402
import tunecache.autotuning  # noqa: E402  (loaded lazily by the package; patched below)

DAEMON_BIN_ENV = "TUNECACHE_DAEMON_BIN"
CLI_BIN_ENV = "TUNECACHE_CLI_BIN"
# Extra daemon arguments, for flags these tests do not know about (shell-quoted).
DAEMON_ARGS_ENV = "TUNECACHE_DAEMON_ARGS"
DAEMON_START_TIMEOUT_S = 30.0
DAEMON_STOP_TIMEOUT_S = 15.0
REDIS_SERVER_ENV = "REDIS_SERVER"
REDIS_START_TIMEOUT_S = 10.0
CLUSTER_CONNECT_TIMEOUT_S = 20.0


def daemon_binary() -> Path:
    configured = os.environ.get(DAEMON_BIN_ENV, "")
    return Path(configured) if configured else REPO_ROOT / "target" / "debug" / "tunecached"


def cli_binary() -> Path:
    """The `tunecache` CLI: $TUNECACHE_CLI_BIN, else target/debug/tunecache."""
    configured = os.environ.get(CLI_BIN_ENV, "")
    return Path(configured) if configured else REPO_ROOT / "target" / "debug" / "tunecache"


def require_binary(binary: Path, name: str, env: str, cargo_args: str) -> Path:
    """``binary`` when it exists. Without it the test is skipped with how to build it, except
    under CI (``$CI`` set), where it fails: a test that needs the daemon must not count as
    passed in CI without running."""
    if binary.is_file():
        return binary
    message = f"{name} binary not found at {binary}: build it (cargo build {cargo_args}) or set {env}"
    if os.environ.get("CI"):
        pytest.fail(f"{message}; under CI it is required")
    pytest.skip(message)


def start_python_worker(script: Path, spec: dict, environment: dict) -> subprocess.Popen:
    """Runs a test worker script with its JSON spec as the one argument, output captured."""
    return subprocess.Popen(
        [sys.executable, str(script), json.dumps(spec)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=environment,
    )


def short_temp_dir(prefix: str) -> Path:
    # A Unix socket path must fit in sun_path (108 bytes); pytest's tmp_path can be longer.
    return Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))


@pytest.fixture
def socket_dir():
    directory = short_temp_dir("tc-py-")
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(autouse=True)
def fresh_warning_state(monkeypatch):
    """Each test sees the once-per-process warnings (get_or_tune's, autotune's broken cached
    config) afresh."""
    monkeypatch.setattr(tunecache.client, "_warned_pid", None)
    monkeypatch.setattr(tunecache.autotuning, "_broken_warned_pid", None)


@pytest.fixture(autouse=True)
def no_view_from_the_runner(monkeypatch):
    """Tests, and the processes they start, read without a view unless they name one: a suite run
    inside a Slurm job or under torchrun would otherwise read every key in that job's view, where
    the first answer stays pinned."""
    monkeypatch.setenv(tunecache.VIEW_ENV, "")


@dataclass
class Daemon:
    socket_path: str
    state_dir: Path
    log_path: Path
    process: subprocess.Popen

    def client(self, timeout: float = 5.0) -> tunecache.Client:
        return tunecache.Client(self.socket_path, timeout=timeout)

    def log_tail(self, max_chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-max_chars:]
        except OSError as err:
            return f"(no daemon log: {err})"


def _wait_until_answering(daemon: Daemon) -> None:
    deadline = time.monotonic() + DAEMON_START_TIMEOUT_S
    last_error = None
    with daemon.client(timeout=1.0) as client:
        while time.monotonic() < deadline:
            if daemon.process.poll() is not None:
                pytest.fail(
                    f"tunecached exited with {daemon.process.returncode} before answering; "
                    f"log:\n{daemon.log_tail()}"
                )
            if os.path.exists(daemon.socket_path):
                try:
                    client.stats()
                    return
                except tunecache.RpcError as err:
                    last_error = err
            time.sleep(0.05)
    daemon.process.kill()
    daemon.process.wait()
    pytest.fail(
        f"tunecached did not answer Stats on {daemon.socket_path} within "
        f"{DAEMON_START_TIMEOUT_S}s (last error: {last_error}); log:\n{daemon.log_tail()}"
    )


@contextlib.contextmanager
def running_daemon(directory: Path, extra_args=(), socket_path: Path = None, unset_env=()):
    """The real tunecached with its socket (or ``socket_path``), state and log in ``directory``
    plus ``extra_args`` and without the variables ``unset_env``, stopped with SIGTERM at the end;
    skips the test when the binary is absent, and fails it under CI (see require_binary)."""
    binary = require_binary(daemon_binary(), "tunecached", DAEMON_BIN_ENV, "-p tunecache-server --bin tunecached")
    directory.mkdir(parents=True, exist_ok=True)
    socket_path = directory / "s.sock" if socket_path is None else socket_path
    state_dir = directory / "state"
    log_path = directory / "daemon.log"
    command = [str(binary), "--socket", str(socket_path), "--state-dir", str(state_dir), *extra_args]
    command += shlex.split(os.environ.get(DAEMON_ARGS_ENV, ""))
    environment = {name: value for name, value in os.environ.items() if name not in unset_env}
    environment.setdefault("RUST_LOG", "info")
    with open(log_path, "wb") as log_file:
        process = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT, env=environment
        )
    running = Daemon(str(socket_path), state_dir, log_path, process)
    try:
        _wait_until_answering(running)
        yield running
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=DAEMON_STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
                pytest.fail(
                    f"tunecached did not exit within {DAEMON_STOP_TIMEOUT_S}s of SIGTERM; "
                    f"log:\n{running.log_tail()}"
                )


@pytest.fixture
def daemon(socket_dir):
    """The real tunecached on a fresh socket and state dir; skipped when the binary is absent
    (failed under CI)."""
    with running_daemon(socket_dir) as running:
        yield running


def _redis_answers(socket_path: Path) -> bool:
    """Whether a Redis answers PING on its unix socket (inline command, so no client library)."""
    try:
        with socketlib.socket(socketlib.AF_UNIX, socketlib.SOCK_STREAM) as probe:
            probe.settimeout(1.0)
            probe.connect(str(socket_path))
            probe.sendall(b"PING\r\n")
            return probe.recv(64).startswith(b"+PONG")
    except OSError:
        return False


@pytest.fixture
def redis_url(socket_dir):
    """A real redis-server for the cluster tier, on a unix socket (no port to collide on) and
    without persistence; its ``redis+unix://`` URL. Skipped without redis-server, except in CI,
    which installs it."""
    configured = os.environ.get(REDIS_SERVER_ENV, "")
    server = configured or shutil.which("redis-server")
    if not server:
        if os.environ.get("CI"):
            pytest.fail(f"redis-server is required under CI: install it or set ${REDIS_SERVER_ENV}")
        pytest.skip(f"redis-server not found on PATH (or set ${REDIS_SERVER_ENV})")
    directory = socket_dir / "redis"
    directory.mkdir()
    socket_path = directory / "redis.sock"
    command = [server, "--port", "0", "--unixsocket", str(socket_path), "--save", "", "--appendonly", "no",
               "--dir", str(directory)]
    with open(directory / "redis.log", "wb") as log_file:
        process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + REDIS_START_TIMEOUT_S
        while not _redis_answers(socket_path):
            if process.poll() is not None or time.monotonic() > deadline:
                log = (directory / "redis.log").read_text(errors="replace")[-4000:]
                pytest.fail(f"redis-server did not answer PING on {socket_path}; log:\n{log}")
            time.sleep(0.02)
        yield f"redis+unix://{socket_path}"
    finally:
        process.kill()
        process.wait()


def wait_cluster_connected(daemon: Daemon) -> None:
    """Waits until ``daemon`` is connected to Redis and bootstrapped, as tests/integration's
    wait_connected does."""
    deadline = time.monotonic() + CLUSTER_CONNECT_TIMEOUT_S
    with daemon.client() as client:
        while True:
            stats = client.stats()
            if stats.cluster_state.startswith("connected") and stats.cluster_bootstrapped:
                return
            if time.monotonic() > deadline:
                pytest.fail(
                    f"{daemon.socket_path} did not connect to Redis within {CLUSTER_CONNECT_TIMEOUT_S}s "
                    f"(cluster_state {stats.cluster_state!r}); log:\n{daemon.log_tail()}"
                )
            time.sleep(0.05)


@pytest.fixture
def two_cluster_nodes(socket_dir, redis_url):
    """Two daemons, nodes ``a`` and ``b``, sharing results through one real Redis (the cluster
    tier), tuner off; each connected before the test starts."""
    with contextlib.ExitStack() as stack:
        nodes = [
            stack.enter_context(
                running_daemon(
                    socket_dir / name,
                    ["--node-name", name, "--tuner", "off", "--cluster-url", redis_url],
                )
            )
            for name in ("a", "b")
        ]
        for node in nodes:
            wait_cluster_connected(node)
        yield nodes


def unique_key(**overrides) -> tunecache.Key:
    """A key no earlier test used, in a namespace the daemon has no tuner for."""
    fields = dict(namespace="pytest", op="gemm", device="cpu|pytest", problem=f'{{"id":"{uuid.uuid4()}"}}')
    fields.update(overrides)
    return tunecache.Key(**fields)


# --- an older daemon ------------------------------------------------------------------------------


@contextlib.contextmanager
def without_forget(daemon: Daemon, directory: Path):
    """``daemon`` as a tunecached older than Forget answers: every call is forwarded to it
    unchanged, as raw bytes, by a grpcio proxy on ``directory/older.sock``, except Forget, which
    is UNIMPLEMENTED (what a daemon before issue 26 says). Yields the proxy's socket path.
    grpcio here is the tests' own, independent of the package."""
    import grpc
    from concurrent import futures

    upstream = grpc.insecure_channel(f"unix:{daemon.socket_path}", options=[("grpc.default_authority", "localhost")])

    def forwarded(call):
        def handle(request, context):
            try:
                return call(request, timeout=context.time_remaining())
            except grpc.RpcError as err:
                context.abort(err.code(), err.details())

        return handle

    class Proxy(grpc.GenericRpcHandler):
        def service(self, details):
            method = details.method
            if method == "/tunecache.v1.TuneCache/Forget":
                def unimplemented(request, context):
                    context.abort(grpc.StatusCode.UNIMPLEMENTED, "Method not found!")

                return grpc.unary_unary_rpc_method_handler(unimplemented)
            if method == "/tunecache.v1.TuneCache/Scan":
                stream = upstream.unary_stream(method)
                return grpc.unary_stream_rpc_method_handler(
                    lambda request, context: iter(stream(request, timeout=context.time_remaining()))
                )
            return grpc.unary_unary_rpc_method_handler(forwarded(upstream.unary_unary(method)))

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8), handlers=[Proxy()])
    proxy_path = directory / "older.sock"
    server.add_insecure_port(f"unix:{proxy_path}")
    server.start()
    try:
        yield str(proxy_path)
    finally:
        server.stop(grace=None)
        upstream.close()


# --- a daemon slow to answer one Record ------------------------------------------------------------


class HoldingProxy:
    """What :func:`holding_records` yields: ``socket_path`` to connect to; ``held`` is set once a
    Record with entries and a lease has arrived and is being held; ``release()`` lets it through
    to the daemon; ``give_ups`` lists the lease ids of the Records with a lease and no entries
    (giving a lease up) that reached the proxy."""

    def __init__(self, socket_path: str):
        self.socket_path = socket_path
        self.held = threading.Event()
        self._release = threading.Event()
        self.give_ups: list = []

    def release(self) -> None:
        self._release.set()


@contextlib.contextmanager
def holding_records(daemon: Daemon, directory: Path):
    """``daemon`` behind a forwarding grpcio proxy on ``directory/holding.sock`` that holds the
    first Record with entries and a lease until ``release()`` (so that the caller's deadline
    passes while the daemon is still "working" on it) and records every give-up that reaches it.
    Every other call is forwarded unchanged, as raw bytes. grpcio here is the tests' own."""
    import grpc
    from concurrent import futures

    from tunecache.v1 import tunecache_pb2 as pb

    upstream = grpc.insecure_channel(f"unix:{daemon.socket_path}", options=[("grpc.default_authority", "localhost")])
    proxy = HoldingProxy(str(directory / "holding.sock"))
    record = upstream.unary_unary("/tunecache.v1.TuneCache/Record")

    def forward(call):
        def handle(request, context):
            try:
                return call(request, timeout=context.time_remaining())
            except grpc.RpcError as err:
                context.abort(err.code(), err.details())

        return handle

    def handle_record(request, context):
        message = pb.RecordRequest.FromString(request)
        if message.lease_id and not message.entries:
            proxy.give_ups.append(message.lease_id)
        elif message.lease_id and not proxy.held.is_set():
            proxy.held.set()
            proxy._release.wait(DAEMON_STOP_TIMEOUT_S)
        return forward(record)(request, context)

    class Proxy(grpc.GenericRpcHandler):
        def service(self, details):
            method = details.method
            if method == "/tunecache.v1.TuneCache/Record":
                return grpc.unary_unary_rpc_method_handler(handle_record)
            if method == "/tunecache.v1.TuneCache/Scan":
                stream = upstream.unary_stream(method)
                return grpc.unary_stream_rpc_method_handler(
                    lambda request, context: iter(stream(request, timeout=context.time_remaining()))
                )
            return grpc.unary_unary_rpc_method_handler(forward(upstream.unary_unary(method)))

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8), handlers=[Proxy()])
    server.add_insecure_port(f"unix:{proxy.socket_path}")
    server.start()
    try:
        yield proxy
    finally:
        proxy.release()
        server.stop(grace=None)
        upstream.close()
