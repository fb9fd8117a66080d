# Owns the client tests that need no tunecached: socket and view resolution, behaviour when the
# daemon is absent or hung (fallback, bounded time, one warning, no exception). get_or_tune's
# flows against the real daemon are test_rank_flow.py's.
from __future__ import annotations

import json
import logging
import os
import socket
import time

import pytest

import tunecache
from conftest import DAEMON_BIN_ENV, running_daemon, unique_key

FALLBACK = {"runner_id": 0, "tactic": -1}
DAEMON_WARNING = "unavailable or failing"


def daemon_warnings(caplog) -> list:
    return [r for r in caplog.records if r.name == "tunecache" and r.levelno == logging.WARNING and DAEMON_WARNING in r.getMessage()]


# --- socket resolution ------------------------------------------------------------------------------


def test_socket_env_wins_over_everything():
    environ = {"TUNECACHE_SOCKET": "/run/custom.sock", "XDG_RUNTIME_DIR": "/run/user/7"}
    assert tunecache.default_socket_path(environ, uid=7) == "/run/custom.sock"


def test_xdg_runtime_dir_is_second():
    environ = {"XDG_RUNTIME_DIR": "/run/user/7"}
    assert tunecache.default_socket_path(environ, uid=7) == "/run/user/7/tunecache/tunecache.sock"


def test_tmp_per_uid_is_last():
    assert tunecache.default_socket_path({}, uid=1234) == "/tmp/tunecache-1234/tunecache.sock"


def test_empty_variables_count_as_unset():
    environ = {"TUNECACHE_SOCKET": "", "XDG_RUNTIME_DIR": ""}
    assert tunecache.default_socket_path(environ, uid=5) == "/tmp/tunecache-5/tunecache.sock"


@pytest.mark.parametrize(
    "variables",
    [
        {"TUNECACHE_SOCKET": "/run/custom.sock", "XDG_RUNTIME_DIR": "/run/user/7"},
        {"XDG_RUNTIME_DIR": "/run/user/7"},
        {"TUNECACHE_SOCKET": "", "XDG_RUNTIME_DIR": ""},
        {},
    ],
    ids=["socket-variable", "runtime-dir", "empty", "neither"],
)
def test_the_rule_for_a_given_environment_is_the_rust_clients(monkeypatch, variables):
    # default_socket_path() of this process is the Rust client's answer; with a mapping given it
    # applies the same rule in Python. They must agree.
    for name in ("TUNECACHE_SOCKET", "XDG_RUNTIME_DIR"):
        monkeypatch.delenv(name, raising=False)
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    assert tunecache.default_socket_path() == tunecache.default_socket_path(dict(variables), uid=os.getuid())


def test_client_uses_the_default_socket_unless_given_one(monkeypatch):
    monkeypatch.setenv("TUNECACHE_SOCKET", "/tmp/from-env.sock")
    with tunecache.Client() as client:
        assert client.socket_path == "/tmp/from-env.sock"
    with tunecache.Client("/tmp/explicit.sock") as client:
        assert client.socket_path == "/tmp/explicit.sock"
    monkeypatch.delenv("TUNECACHE_SOCKET")
    monkeypatch.setenv("XDG_RUNTIME_DIR", "/run/user/42")
    with tunecache.Client() as client:
        assert client.socket_path == "/run/user/42/tunecache/tunecache.sock"


def test_channel_sets_a_valid_authority():
    assert ("grpc.default_authority", "localhost") in tunecache.CHANNEL_OPTIONS


# --- view resolution ------------------------------------------------------------------------------

EVERY_VIEW_SOURCE = {
    "TUNECACHE_VIEW": "my-view",
    "SLURM_JOB_ID": "4242",
    "SLURM_STEP_ID": "3",
    "TORCHELASTIC_RUN_ID": "run-7",
}


def test_tunecache_view_wins_over_every_other_source():
    assert tunecache.resolve_view(EVERY_VIEW_SOURCE, explicit="explicit") == "my-view"


def test_empty_tunecache_view_turns_views_off_even_with_later_sources_set():
    environ = dict(EVERY_VIEW_SOURCE, TUNECACHE_VIEW="")
    assert tunecache.resolve_view(environ, explicit="explicit") == ""


def test_slurm_job_and_step_come_second():
    environ = {name: value for name, value in EVERY_VIEW_SOURCE.items() if name != "TUNECACHE_VIEW"}
    assert tunecache.resolve_view(environ, explicit="explicit") == "slurm-4242.3"


def test_a_slurm_job_without_a_step_is_the_job_alone():
    assert tunecache.resolve_view({"SLURM_JOB_ID": "4242", "TORCHELASTIC_RUN_ID": "run-7"}) == "slurm-4242"
    assert tunecache.resolve_view({"SLURM_JOB_ID": "4242", "SLURM_STEP_ID": ""}) == "slurm-4242"


def test_a_slurm_step_without_a_job_names_nothing():
    assert tunecache.resolve_view({"SLURM_STEP_ID": "3", "TORCHELASTIC_RUN_ID": "run-7"}) == "torchelastic-run-7"


def test_torchrun_comes_third():
    environ = {"TORCHELASTIC_RUN_ID": "run-7"}
    assert tunecache.resolve_view(environ, explicit="explicit") == "torchelastic-run-7"


def test_torchrun_default_run_id_names_no_job():
    # torchrun without --rdzv-id sets TORCHELASTIC_RUN_ID=none in every run.
    assert tunecache.resolve_view({"TORCHELASTIC_RUN_ID": "none"}, explicit="explicit") == "explicit"
    assert tunecache.resolve_view({"TORCHELASTIC_RUN_ID": "none"}) == ""


def test_empty_launcher_variables_count_as_unset():
    environ = {"SLURM_JOB_ID": "", "TORCHELASTIC_RUN_ID": ""}
    assert tunecache.resolve_view(environ, explicit="explicit") == "explicit"


def test_the_explicit_name_is_the_last_resort():
    assert tunecache.resolve_view({}, explicit="explicit") == "explicit"
    assert tunecache.resolve_view({}) == ""


def test_the_client_resolves_its_view_from_the_process_environment(monkeypatch, socket_dir):
    path = str(socket_dir / "absent.sock")
    monkeypatch.delenv("TUNECACHE_VIEW")
    for name in ("SLURM_JOB_ID", "SLURM_STEP_ID", "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(name, raising=False)
    with tunecache.Client(path) as client:
        assert client.view == ""
    with tunecache.Client(path, view="explicit") as client:
        assert client.view == "explicit"
    monkeypatch.setenv("SLURM_JOB_ID", "99")
    monkeypatch.setenv("SLURM_STEP_ID", "0")
    with tunecache.Client(path, view="explicit") as client:
        assert client.view == "slurm-99.0"
    monkeypatch.setenv("TUNECACHE_VIEW", "")
    with tunecache.Client(path, view="explicit") as client:
        assert client.view == ""


# --- daemon absent or hung ------------------------------------------------------------------------


def must_not_run():
    raise AssertionError("tune_fn must not run without a daemon")


def test_absent_daemon_gives_the_fallback_quickly_and_warns_once(socket_dir, caplog):
    caplog.set_level(logging.DEBUG, logger="tunecache")
    client = tunecache.Client(str(socket_dir / "nobody-here.sock"), timeout=2.0)
    started = time.monotonic()
    results = [
        client.get_or_tune(unique_key(), must_not_run, FALLBACK, wait_ms=5_000) for _ in range(3)
    ]
    elapsed = time.monotonic() - started
    assert results == [FALLBACK] * 3
    # No daemon means an immediate connection failure, not a wait for wait_ms.
    assert elapsed < 4.0, elapsed
    assert len(daemon_warnings(caplog)) == 1, caplog.text


def test_module_helper_uses_the_default_socket_and_never_raises(socket_dir, monkeypatch, caplog):
    caplog.set_level(logging.WARNING, logger="tunecache")
    monkeypatch.setenv("TUNECACHE_SOCKET", str(socket_dir / "absent.sock"))
    monkeypatch.setattr(tunecache.client, "_default_client", None)
    started = time.monotonic()
    assert tunecache.get_or_tune(unique_key(), must_not_run, "fallback", wait_ms=1_000) == "fallback"
    assert tunecache.get_or_tune(unique_key(), must_not_run, "fallback", wait_ms=1_000) == "fallback"
    assert time.monotonic() - started < 4.0
    assert len(daemon_warnings(caplog)) == 1, caplog.text
    assert str(socket_dir / "absent.sock") in daemon_warnings(caplog)[0].getMessage()


def test_stale_socket_file_gives_the_fallback(socket_dir, caplog):
    caplog.set_level(logging.WARNING, logger="tunecache")
    path = str(socket_dir / "stale.sock")
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(path)  # bound, never listening: connect() is refused
    try:
        client = tunecache.Client(path, timeout=2.0)
        started = time.monotonic()
        assert client.get_or_tune(unique_key(), must_not_run, FALLBACK, wait_ms=5_000) == FALLBACK
        assert time.monotonic() - started < 4.0
        assert len(daemon_warnings(caplog)) == 1
    finally:
        stale.close()


def test_hung_daemon_is_bounded_by_wait_ms_plus_timeout(socket_dir, caplog):
    caplog.set_level(logging.WARNING, logger="tunecache")
    path = str(socket_dir / "hung.sock")
    hung = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    hung.bind(path)
    hung.listen(16)  # connections complete in the kernel, but nobody ever speaks HTTP/2
    try:
        client = tunecache.Client(path, timeout=0.5)
        started = time.monotonic()
        assert client.get_or_tune(unique_key(), must_not_run, FALLBACK, wait_ms=300) == FALLBACK
        elapsed = time.monotonic() - started
        assert 0.5 < elapsed < 3.0, elapsed
        assert len(daemon_warnings(caplog)) == 1
    finally:
        hung.close()


def test_unusable_key_gives_the_fallback(socket_dir):
    client = tunecache.Client(str(socket_dir / "absent.sock"), timeout=1.0)
    assert client.get_or_tune({"no_such_field": 1}, must_not_run, FALLBACK) == FALLBACK


# --- the daemon fixture itself --------------------------------------------------------------------


@pytest.mark.parametrize("ci", ["", "1"], ids=["outside-ci", "under-ci"])
def test_a_missing_daemon_binary_skips_outside_ci_and_fails_under_ci(ci, socket_dir, monkeypatch):
    """The daemon tests (about 50) cannot count as passed in CI without running: under $CI a
    missing tunecached fails them; elsewhere it skips them, saying how to build it."""
    monkeypatch.setenv(DAEMON_BIN_ENV, str(socket_dir / "no-such-tunecached"))
    if ci:
        monkeypatch.setenv("CI", ci)
    else:
        monkeypatch.delenv("CI", raising=False)
    # Caught whichever it is, so that a skip where a failure is due fails this test rather than
    # skipping it.
    try:
        with running_daemon(socket_dir):
            pass
    except (pytest.fail.Exception, pytest.skip.Exception) as outcome:
        raised = outcome
    else:
        raise AssertionError("running_daemon started a daemon that does not exist")
    expected = pytest.fail.Exception if ci else pytest.skip.Exception
    assert type(raised) is expected, repr(raised)
    assert "tunecached binary not found" in str(raised)
