# Owns the tests of the Python client's trust check on the DEFAULT socket path: a directory or
# socket owned by another user (uid 65534 here), a group/other-writable directory or a symlink
# is refused with a clear error; an explicit path (argument or $TUNECACHE_SOCKET) is trusted.
from __future__ import annotations

import logging
import os
import shutil
import contextlib
import subprocess
import time

import pytest

import tunecache
from conftest import running_daemon, short_temp_dir, unique_key

OTHER_UID = 65534  # nobody


@pytest.fixture
def runtime_dir(monkeypatch):
    """$XDG_RUNTIME_DIR for the test, $TUNECACHE_SOCKET unset: the default is runtime/tunecache/."""
    directory = short_temp_dir("tc-trust-")
    monkeypatch.delenv(tunecache.SOCKET_ENV, raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(directory))
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


class _Served(contextlib.ExitStack):
    def stop(self, grace=None):
        self.close()


def serve(socket_path):
    """The real tunecached on ``socket_path``, its state and log beside the directory under test.
    Its environment has no XDG_RUNTIME_DIR, so the path is not its own default but a named one,
    which it trusts: the directories these tests plant are for the client to refuse."""
    served = _Served()
    state = short_temp_dir("tc-trust-state-")
    served.callback(shutil.rmtree, state, True)
    served.enter_context(running_daemon(state, socket_path=socket_path, unset_env=("XDG_RUNTIME_DIR",)))
    return served


def socket_dir(runtime, mode=0o700):
    directory = runtime / "tunecache"
    directory.mkdir(mode=mode)
    os.chmod(directory, mode)
    return directory


def needs_root():
    if os.geteuid() != 0:
        if os.environ.get("CI"):
            pytest.fail("these tests chown to another uid and need root in CI")
        pytest.skip("needs root to chown to another uid")


def test_default_socket_in_a_private_directory_is_used(runtime_dir):
    directory = socket_dir(runtime_dir)
    server = serve(directory / "tunecache.sock")
    try:
        assert tunecache.default_socket_path() == str(directory / "tunecache.sock")
        with tunecache.Client() as client:
            assert client.resolve(unique_key(), wait_ms=0).WhichOneof("outcome") == "tune_here"
    finally:
        server.stop(grace=None)


@pytest.mark.parametrize("problem", ["directory owner", "socket owner", "writable", "symlink"])
def test_default_socket_is_refused_when_others_could_have_planted_it(runtime_dir, problem):
    needs_root()
    directory = socket_dir(runtime_dir, mode=0o777 if problem == "writable" else 0o700)
    if problem == "symlink":
        real = runtime_dir / "elsewhere"
        directory.rename(real)
        directory.symlink_to(real)
    server = serve(directory / "tunecache.sock")
    try:
        if problem == "directory owner":
            os.chown(directory, OTHER_UID, OTHER_UID)
        if problem == "socket owner":
            os.chown(directory / "tunecache.sock", OTHER_UID, OTHER_UID)
        with pytest.raises(tunecache.UntrustedSocketError) as refused:
            tunecache.Client()
        message = str(refused.value)
        expected = {
            "directory owner": f"owned by uid {OTHER_UID}",
            "socket owner": f"owned by uid {OTHER_UID}",
            "writable": "writable by group or others",
            "symlink": "symlink",
        }[problem]
        assert expected in message, message
        assert str(directory) in message, message
        # An explicit path is the caller's choice and is trusted.
        with tunecache.Client(directory / "tunecache.sock") as client:
            assert client.resolve(unique_key(), wait_ms=0).WhichOneof("outcome") == "tune_here"
    finally:
        server.stop(grace=None)


def test_explicit_socket_variable_is_trusted_and_get_or_tune_falls_back(runtime_dir, monkeypatch, caplog):
    needs_root()
    directory = socket_dir(runtime_dir)
    os.chown(directory, OTHER_UID, OTHER_UID)
    server = serve(directory / "tunecache.sock")
    try:
        monkeypatch.setattr(tunecache.client, "_default_client", None)
        with caplog.at_level(logging.WARNING, logger="tunecache"):
            assert tunecache.get_or_tune(unique_key(), lambda: ({"x": 1}, 1.0), "fallback") == "fallback"
        assert "owned by uid 65534" in caplog.text
        monkeypatch.setenv(tunecache.SOCKET_ENV, str(directory / "tunecache.sock"))
        with tunecache.Client() as client:
            assert client.resolve(unique_key(), wait_ms=0).WhichOneof("outcome") == "tune_here"
    finally:
        server.stop(grace=None)


def test_a_daemon_running_as_another_uid_is_refused_on_a_named_path_unless_trusted(monkeypatch, caplog):
    """Issue 23: the squatter's daemon (uid 65534 here, the caller is root) is refused by its
    peer credentials even on a path the caller named, and get_or_tune falls back without
    sending it anything; TUNECACHE_TRUST_UID admits it."""
    needs_root()
    from conftest import daemon_binary

    setpriv = shutil.which("setpriv")
    if setpriv is None or not daemon_binary().is_file():
        if os.environ.get("CI"):
            pytest.fail("needs setpriv and the tunecached binary in CI")
        pytest.skip("needs setpriv and the tunecached binary")
    directory = short_temp_dir("tc-squat-")
    os.chmod(directory, 0o755)
    socket_dir_path = directory / "run"
    socket_dir_path.mkdir(mode=0o700)
    os.chown(socket_dir_path, OTHER_UID, OTHER_UID)
    socket_path = socket_dir_path / "tunecache.sock"
    command = [setpriv, "--reuid", str(OTHER_UID), "--regid", str(OTHER_UID), "--clear-groups",
               str(daemon_binary()), "--socket", str(socket_path), "--state-dir", str(socket_dir_path / "state")]
    log = open(directory / "daemon.log", "wb")
    process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while not socket_path.exists():
            assert process.poll() is None, (directory / "daemon.log").read_text()
            assert time.monotonic() < deadline, "the other uid's daemon did not start"
            time.sleep(0.05)
        monkeypatch.delenv(tunecache.TRUST_UID_ENV, raising=False)
        with pytest.raises(tunecache.UntrustedDaemonError) as refused:
            tunecache.Client(socket_path)
        assert f"runs as uid {OTHER_UID}" in str(refused.value)
        assert f"{tunecache.TRUST_UID_ENV}={OTHER_UID}" in str(refused.value)

        # The process-wide client on $TUNECACHE_SOCKET: a fallback and one warning, no call made.
        monkeypatch.setenv(tunecache.SOCKET_ENV, str(socket_path))
        monkeypatch.setattr(tunecache.client, "_default_client", None)
        with caplog.at_level(logging.WARNING, logger="tunecache"):
            assert tunecache.get_or_tune(unique_key(), lambda: ({"x": 1}, 1.0), "fallback") == "fallback"
        assert f"runs as uid {OTHER_UID}" in caplog.text

        monkeypatch.setenv(tunecache.TRUST_UID_ENV, f"4242,{OTHER_UID}")
        with tunecache.Client(socket_path) as client:
            assert client.stats().daemon_uid == OTHER_UID
            assert client.stats().daemon_pid == process.pid
            stats = client.stats()
            assert (stats.resolves, stats.records) == (0, 0), "the refused get_or_tune reached the daemon"
    finally:
        process.terminate()
        process.wait(timeout=15)
        log.close()
        shutil.rmtree(directory, ignore_errors=True)
