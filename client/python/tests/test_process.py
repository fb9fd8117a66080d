# Owns the tests of what a Python process gets from the package (issue 28), against the real
# daemon: importing starts nothing and imports no grpcio; at most one background thread, however
# many clients and calls; every call releases the GIL; Ctrl-C interrupts a Resolve wait within
# 100 ms and the daemon sees the waiter leave; a forked child (os.fork, multiprocessing) gets a
# working client of its own, without deadlock; many threads share one client.
from __future__ import annotations

import json
import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

import tunecache
from conftest import unique_key

INTERRUPT_LIMIT_S = 0.1


def tasks() -> int:
    return len(os.listdir(f"/proc/{os.getpid()}/task"))


def run_python(code: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        capture_output=True, text=True, timeout=timeout, env=environment,
    )


def test_importing_starts_no_thread_and_imports_no_grpcio(daemon):
    checked = run_python(
        """
        import os, sys
        def tasks(): return len(os.listdir(f"/proc/{os.getpid()}/task"))
        import tunecache, tunecache.integrations.trtllm
        assert tasks() == 1, tasks()
        client = tunecache.Client(sys.argv[1])
        assert tasks() == 1, tasks()
        client.stats()
        others = [tunecache.Client(sys.argv[1]) for _ in range(3)]
        for other in others:
            other.lookup([tunecache.Key(namespace="n", op="o", device="d", problem="p")])
        assert tasks() == 2, tasks()
        try:
            client.record([{"key": {"namespace": ""}, "result": {"config": "{}"}}])
        except tunecache.RpcError as err:
            assert type(err) is tunecache.RpcError, type(err).__mro__
            assert err.code() is tunecache.StatusCode.INVALID_ARGUMENT, err.code()
        else:
            raise AssertionError("an empty namespace was accepted")
        assert not [m for m in sys.modules if m == "grpc" or m.startswith(("grpc.", "google.protobuf"))]
        print("ok")
        """,
        daemon.socket_path,
    )
    assert checked.returncode == 0 and "ok" in checked.stdout, checked.stdout + checked.stderr


def hold_a_lease(client: tunecache.Client, key: tunecache.Key) -> str:
    response = client.resolve(key, wait_ms=0, lease_ms=120_000)
    assert response.WhichOneof("outcome") == "tune_here"
    return response.tune_here.lease_id


def wait_for_waiters(client: tunecache.Client, count: int) -> None:
    deadline = time.monotonic() + 10
    while client.stats().waiters != count:
        assert time.monotonic() < deadline, f"waiters never became {count}"
        time.sleep(0.01)


def test_a_resolve_wait_releases_the_gil(daemon):
    key = unique_key()
    with daemon.client() as client:
        lease_id = hold_a_lease(client, key)
        waiting = threading.Thread(target=lambda: client.resolve(key, wait_ms=1_500, can_tune=False))
        waiting.start()
        wait_for_waiters(client, 1)
        # This thread runs Python while the other waits in the call.
        spins, started = 0, time.monotonic()
        while waiting.is_alive() and time.monotonic() - started < 5:
            spins += 1
        waiting.join()
        assert spins > 100_000, spins
        client.record([], lease_id=lease_id)


def test_ctrl_c_interrupts_a_resolve_wait_within_100_ms(daemon):
    key = unique_key()
    with daemon.client() as client:
        lease_id = hold_a_lease(client, key)
        waiter = subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(
                """
                import json, signal, sys, time, tunecache
                # A shell starts a background job with SIGINT ignored, and Python keeps an
                # ignored SIGINT ignored: this waiter is a foreground program's rank.
                signal.signal(signal.SIGINT, signal.default_int_handler)
                key = tunecache.Key(**json.loads(sys.argv[2]))
                client = tunecache.Client(sys.argv[1])
                print("waiting", flush=True)
                try:
                    client.resolve(key, wait_ms=60_000, can_tune=False)
                    print("answered")
                except KeyboardInterrupt:
                    print("interrupted", time.monotonic(), flush=True)
                """), daemon.socket_path,
             json.dumps({"namespace": key.namespace, "op": key.op, "device": key.device, "problem": key.problem})],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        try:
            assert waiter.stdout.readline().strip() == "waiting"
            wait_for_waiters(client, 1)
            sent = time.monotonic()
            waiter.send_signal(signal.SIGINT)
            out, err = waiter.communicate(timeout=10)
        finally:
            if waiter.poll() is None:
                waiter.kill()
        word, at = out.split()
        assert word == "interrupted", out + err
        # CLOCK_MONOTONIC is one clock for every process of the machine.
        assert float(at) - sent < INTERRUPT_LIMIT_S, f"interrupted {float(at) - sent:.3f}s after SIGINT"
        # The daemon saw the waiter leave; the lease is untouched.
        wait_for_waiters(client, 0)
        assert client.stats().leases_active == 1
        client.record([], lease_id=lease_id)


def child_calls(socket_path: str, key_fields: dict) -> dict:
    client = _forked_client
    key = tunecache.Key(**key_fields)
    tuned = client.get_or_tune(key, lambda: ({"pid": os.getpid()}, 1.0), "FALLBACK", wait_ms=5_000)
    return {"hits": len(client.lookup([key])), "tuned": tuned, "tasks": tasks()}


_forked_client = None


def test_a_forked_child_gets_a_working_client_of_its_own(daemon):
    global _forked_client
    _forked_client = daemon.client()
    _forked_client.stats()  # the parent's thread and connection exist before the fork
    parent_tasks = tasks()
    # A Resolve in flight on another thread while the process forks.
    key = unique_key()
    lease_id = hold_a_lease(_forked_client, key)
    busy = threading.Thread(target=lambda: _forked_client.resolve(key, wait_ms=2_000, can_tune=False))
    busy.start()
    try:
        wait_for_waiters(_forked_client, 1)
        pid = os.fork()
        if pid == 0:  # the child: a working client lazily, within a bounded time
            code = 1
            try:
                fresh = unique_key()
                answer = child_calls(daemon.socket_path, {"namespace": fresh.namespace, "op": fresh.op,
                                                          "device": fresh.device, "problem": fresh.problem})
                code = 0 if answer["tuned"] == {"pid": os.getpid()} and answer["hits"] == 1 and answer["tasks"] <= 2 else 3
            finally:
                os._exit(code)
        deadline = time.monotonic() + 20
        while True:
            finished, status = os.waitpid(pid, os.WNOHANG)
            if finished:
                break
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                pytest.fail("the forked child hung")
            time.sleep(0.02)
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
    finally:
        busy.join()
        _forked_client.record([], lease_id=lease_id)
    # The parent's client is untouched by the child.
    assert _forked_client.lookup([key]) == []
    assert tasks() == parent_tasks


def multiprocessing_worker(key_fields: dict, queue) -> None:
    key = tunecache.Key(**key_fields)
    queue.put((os.getpid(), _forked_client.get_or_tune(key, lambda: ({"by": os.getpid()}, 1.0), "FALLBACK")))


def test_multiprocessing_fork_workers_share_one_tuning(daemon):
    global _forked_client
    _forked_client = daemon.client()
    _forked_client.stats()
    key = unique_key()
    fields = {"namespace": key.namespace, "op": key.op, "device": key.device, "problem": key.problem}
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    workers = [context.Process(target=multiprocessing_worker, args=(fields, queue)) for _ in range(4)]
    for worker in workers:
        worker.start()
    answers = [queue.get(timeout=30) for _ in workers]
    for worker in workers:
        worker.join(timeout=10)
        assert worker.exitcode == 0
    tuners = {answer["by"] for _pid, answer in answers}
    assert len(tuners) == 1 and tuners <= {pid for pid, _ in answers}, answers


def test_threads_share_one_client(daemon):
    with daemon.client() as client:
        keys = [unique_key() for _ in range(64)]
        client.record([{"key": k, "result": {"config": "{}", "time_us": 1.0}} for k in keys])
        failures = []

        def work(offset):
            try:
                for round_ in range(20):
                    key = keys[(offset + round_) % len(keys)]
                    assert client.lookup([key])[0].key == key
            except Exception as err:  # reported below
                failures.append(err)

        threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert not failures, failures
        assert client.stats().lookups >= 8 * 20


def test_auto_start_brings_up_a_daemon_without_another_thread(socket_dir):
    from conftest import daemon_binary

    if not daemon_binary().is_file():
        pytest.skip(f"tunecached binary not found at {daemon_binary()}")
    socket_path = socket_dir / "auto" / "tunecache.sock"
    environment = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    environment.update(TUNECACHE_AUTOSTART="1", TUNECACHE_DAEMON_BIN=str(daemon_binary()))
    started = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(
            """
            import os, sys, tunecache
            client = tunecache.Client(sys.argv[1])
            stats = client.stats()
            print(stats.daemon_pid, len(os.listdir(f"/proc/{os.getpid()}/task")))
            """), str(socket_path)],
        capture_output=True, text=True, timeout=60, env=environment,
    )
    assert started.returncode == 0, started.stdout + started.stderr
    daemon_pid, threads = (int(word) for word in started.stdout.split())
    try:
        assert threads == 2, threads  # the main thread and the package's one
    finally:
        os.kill(daemon_pid, signal.SIGTERM)
