# Owns one process of the Triton cache-manager tests: it installs the stand-in driver, then
# calls a real @triton.autotune kernel (Triton's Autotuner, compiler and cache code as shipped)
# once, and prints the chosen config and its launch count as JSON on its last stdout line. The
# benchmarker appends "<pid> <call>" to a shared log per benchmarked config (O_APPEND); with a
# doom marker, the first process to benchmark SIGKILLs itself there, holding the lease; with
# client_timeout_s, the drop-in's client has that deadline.
from __future__ import annotations

import json
import logging
import os
import signal
import sys

import triton
import triton.language as tl

import triton_standin

# Triton's timings are milliseconds: [median, p20, p80] per config, by benchmark order.
TIMINGS_MS = [[0.030, 0.029, 0.031], [0.010, 0.009, 0.011], [0.020, 0.019, 0.021]]
BLOCKS = [16, 32, 64]  # the second config is the fastest


def main() -> int:
    spec = json.loads(sys.argv[1])
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    log_fd = os.open(spec["bench_log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    calls = []

    def benchmarker(kernel_call, quantiles, **kwargs):
        os.write(log_fd, f"{os.getpid()} {len(calls)}\n".encode())
        doom_marker = spec.get("doom_marker")
        if doom_marker:
            try:
                os.close(os.open(doom_marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
                os.kill(os.getpid(), signal.SIGKILL)
            except FileExistsError:
                pass
        kernel_call()  # compiles this config and launches it through the stand-in driver
        timing = TIMINGS_MS[len(calls)]
        calls.append(timing)
        return list(timing)

    standin = triton_standin.install(benchmarker)
    if spec.get("client_timeout_s"):
        # The drop-in's client with a shorter deadline than its default (the module Triton loads
        # for TRITON_CACHE_MANAGER, loaded here first).
        import tunecache.integrations.triton as manager

        manager._daemon = manager._make_daemon(timeout=spec["client_timeout_s"])

    @triton.autotune(configs=[triton.Config({"BLOCK": block}) for block in BLOCKS], key=["n"])
    @triton.jit
    def scale_kernel(n, BLOCK: tl.constexpr):
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.static_assert(BLOCK >= 16)
        _ = offsets < n

    scale_kernel[(1,)](spec.get("n", 4096))
    print(json.dumps({
        "best": scale_kernel.best_config.kwargs,
        "benchmarked": len(calls),
        "launches": standin.launches,
        "pid": os.getpid(),
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
