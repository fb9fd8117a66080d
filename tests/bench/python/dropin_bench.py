# Owns what the drop-in benchmark scripts (bitblas_load.py, flashinfer_tune.py, inductor_tune.py)
# share: where the workspace's binaries are (--bin-dir, else target/release, then target/debug),
# starting a daemon and waiting until it answers Stats, mounting slowfs (a slow shared filesystem)
# when /dev/fuse is there, and taking both down again. Each script keeps its modes, its ranks and
# its report.
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

REPO_ROOT = Path(__file__).resolve().parents[3]


def binary(name: str, bin_dir: Optional[str]) -> Path:
    if bin_dir is not None:
        return Path(bin_dir) / name
    for profile in ("release", "debug"):
        path = REPO_ROOT / "target" / profile / name
        if path.is_file():
            return path
    raise SystemExit(f"{name} not built (cargo build --bins -p tunecache-server -p tunecache-slowfs)")


def start_daemon(bin_dir: Optional[str], work: Path, socket: str) -> subprocess.Popen:
    """tunecached on `socket` with its state and log in `work`, answering Stats when this returns."""
    log = open(work / "daemon.log", "wb")
    daemon = subprocess.Popen([str(binary("tunecached", bin_dir)), "--socket", socket, "--state-dir",
                               str(work / "state"), "--tuner", "off"], stdout=log, stderr=subprocess.STDOUT)
    probe = "import sys, tunecache; tunecache.Client(sys.argv[1], timeout=1).stats()"
    deadline = time.monotonic() + 30
    while subprocess.run([sys.executable, "-c", probe, socket], capture_output=True).returncode != 0:
        if daemon.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"tunecached did not start: {(work / 'daemon.log').read_text()[-2000:]}")
        time.sleep(0.05)
    return daemon


def mount_slowfs(bin_dir: Optional[str], work: Path, backing: Path, mountpoint: Path, latency_ms: int) -> Optional[int]:
    """slowfs over `backing` at `mountpoint` adding `latency_ms` per operation; its pid, or None
    (said on stderr) without /dev/fuse or when it does not mount."""
    if not Path("/dev/fuse").exists():
        print("slowfs skipped: no /dev/fuse", file=sys.stderr)
        return None
    mountpoint.mkdir(parents=True, exist_ok=True)
    # The detached slowfs keeps stderr for its log: a pipe there would never reach EOF.
    with open(work / "slowfs.log", "wb") as slowfs_log:
        mounted = subprocess.run([str(binary("slowfs", bin_dir)), str(backing), str(mountpoint), "--latency-ms",
                                  str(latency_ms), "--threads", "64"], stdin=subprocess.DEVNULL,
                                 stdout=subprocess.PIPE, stderr=slowfs_log, text=True)
    if mounted.returncode != 0:
        print(f"slowfs skipped: {(work / 'slowfs.log').read_text().strip()}", file=sys.stderr)
        return None
    return int(mounted.stdout.strip())


def take_down(slowfs_pid: Optional[int], mountpoint: Path, daemon: Optional[subprocess.Popen]) -> None:
    """Unmounts slowfs (waiting until the mount is gone) and stops the daemon."""
    if slowfs_pid is not None:
        os.kill(slowfs_pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and str(mountpoint) in open("/proc/self/mounts").read():
            time.sleep(0.02)
    if daemon is not None:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(timeout=15)


def release_ranks(mode: str, commands: list, environment: dict, timeout_s: float) -> tuple:
    """Starts a rank process per command and holds them at the barrier (each says `ready` once
    imported), then releases them at once; answers (the release time, each rank's last stdout
    line as JSON)."""
    processes = [subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, env=environment) for command in commands]
    for process in processes:
        line = process.stdout.readline()
        if line.strip() != "ready":
            raise SystemExit(f"{mode} rank not ready: {line!r} {process.stderr.read()[-2000:]}")
    released = time.time()
    for process in processes:
        process.stdin.close()
        process.stdin = None  # communicate() below must not flush it
    reports = []
    for process in processes:
        out, err = process.communicate(timeout=timeout_s)
        if process.returncode != 0:
            raise SystemExit(f"{mode} rank failed: {err[-2000:]}")
        reports.append(json.loads(out.strip().splitlines()[-1]))
    return released, reports
