# Owns one process of the Triton compiled-kernel tests: it installs the stand-in driver, then
# launches a real @triton.jit kernel (no autotuning) once, so that Triton's compile() runs as
# shipped, down to ptxas, through whatever TRITON_CACHE_MANAGER the environment names. Triton's
# own compilation listener appends "<pid> compiled" or "<pid> cached" to a shared log per
# compile() call (O_APPEND), so the test counts the compilations that really ran. The last stdout
# line is JSON: the pid, whether each compile() found its kernel cached, the launch count. With
# "blocks", it launches the kernel once per BLOCK value, each a kernel to compile. With a doom
# marker, the first process to put a .cubin (so the one compiling) has that put raise, as a
# failing compilation does; it stays alive (its lease is not ended by its exit) until another
# process has compiled the kernel, or a minute has passed, and reports "failed".
from __future__ import annotations

import json
import logging
import os
import sys
import time

import triton
import triton.language as tl
from triton import knobs

import triton_standin


def main() -> int:
    spec = json.loads(sys.argv[1])
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    log_fd = os.open(spec["compile_log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    seen = []

    def listener(src, metadata, metadata_group, times, cache_hit):
        # Called by compile() once per call: cache_hit False only when its pipeline ran.
        seen.append(cache_hit)
        os.write(log_fd, f"{os.getpid()} {'cached' if cache_hit else 'compiled'}\n".encode())

    knobs.compilation.listener = listener

    def no_benchmarks(kernel_call, quantiles, **kwargs):
        raise AssertionError("this worker does not autotune")

    standin = triton_standin.install(no_benchmarks)
    doom_marker = spec.get("doom_marker")
    if doom_marker:
        from triton.runtime.cache import FileCacheManager

        put = FileCacheManager.put

        def failing_put(self, data, filename, binary=True):
            if filename.endswith(".cubin"):
                try:
                    os.close(os.open(doom_marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
                    raise RuntimeError("doomed compilation")
                except FileExistsError:
                    pass
            return put(self, data, filename, binary)

        FileCacheManager.put = failing_put

    @triton.jit
    def shift_kernel(n, BLOCK: tl.constexpr):
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        _ = offsets < n

    failed = False
    for block in spec.get("blocks", [64]):  # each BLOCK is a kernel of its own (a cache key)
        try:
            shift_kernel[(1,)](spec.get("n", 4096), BLOCK=block)
        except RuntimeError as err:
            if "doomed compilation" not in str(err):
                raise
            failed = True
    if failed:
        # Triton dropped its cache manager with the exception; wait (alive) for another process.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with open(spec["compile_log"]) as log:
                if any(line.split()[1] == "compiled" for line in log):
                    break
            time.sleep(0.05)
    print(json.dumps({"pid": os.getpid(), "cache_hits": seen, "launches": standin.launches, "failed": failed}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
