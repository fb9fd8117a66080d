# Owns one PyTorch Inductor rank process for the drop-in tests and the benchmark: real torch
# (2.15.0, on the CPU: Inductor benchmarks its C++ GEMM template against ATen's), the drop-in
# turned on as the spec says (install(), TUNECACHE_INDUCTOR=1, or not at all), a frozen Linear
# per shape compiled with mode="max-autotune" and run once, and, as JSON on its last stdout line,
# the benchmark rounds Inductor ran (calls of the benchmark function PersistentCache.lookup was
# handed), each lookup's winning choice and timings, Inductor's own cache counters, the wall
# time of the compiles and when they ended (Unix seconds, for a benchmark's wall across ranks).
#
# Spec (JSON, the one argument): shapes ([[in_features, out_features, batch], ...]), dropin
# ("install" | "env" | "none"), barrier (optional: print "ready" once torch is imported, then
# start when stdin closes), remote_fx (optional: compile without freezing, for the FX graph cache,
# whose remote cache the drop-in turns on: the graph-cache test), counters (optional: print
# Inductor's counters), kernel (optional, instead of shapes: {"filename", "configs_hash",
# "autotune_ms"}: a stand-in Triton kernel's AutotuneCache, created, read and saved by Inductor's
# own class as its autotuner does, with a sleep standing in for the GPU autotune; the report says
# whether this rank autotuned and which config it got).
from __future__ import annotations

import json
import os
import sys
import time


def kernel(spec: dict) -> dict:
    from torch._inductor.runtime.autotune_cache import AutotuneCache
    from torch._inductor.runtime.triton_compat import Config

    configs = [Config({"XBLOCK": 64}, num_warps=4, num_stages=1), Config({"XBLOCK": 128}, num_warps=8, num_stages=1)]
    meta = {"autotune_local_cache": True, "autotune_remote_cache": spec.get("remote", None)}
    if spec.get("barrier"):
        print("ready", flush=True)
        sys.stdin.read()
    cache = AutotuneCache.create(meta, spec["filename"], spec["configs_hash"])
    best = cache.read_best(meta, configs) if cache is not None else None
    autotuned = best is None
    if autotuned:
        time.sleep(spec.get("autotune_ms", 0) / 1000)
        best = configs[1]
        if cache is not None:
            cache.save(best, time_taken_ns=25_000_000)
    return {"autotuned": autotuned, "best": dict(best.kwargs, num_warps=best.num_warps), "cache": cache is not None}


def main() -> None:
    spec = json.loads(sys.argv[1])
    # TUNECACHE_INDUCTOR=1's start-up hook has run by now, and install() runs next: neither may
    # import torch (a rank that never compiles must not pay for it). A stock rank may be run by a
    # wrapper that imported torch first (the benchmark's process group).
    if spec.get("dropin") in ("install", "env"):
        assert "torch" not in sys.modules, "the start-up hook imported torch"
    if spec.get("dropin") == "install":
        import tunecache.integrations.inductor as drop_in

        drop_in.install()
        assert "torch" not in sys.modules, "install() imported torch"
    if "kernel" in spec:
        print(json.dumps(kernel(dict(spec["kernel"], barrier=spec.get("barrier")))), flush=True)
        return
    import torch
    import torch._inductor.config as inductor_config
    from torch._dynamo.utils import counters
    from torch._inductor import codecache

    rounds = []
    lookups = []
    patched = codecache.PersistentCache.lookup

    def counting_lookup(self, choices, op, inputs, benchmark, hint_override=None):
        # Instruments whatever lookup is installed (stock or the drop-in's): counts the benchmark
        # rounds it runs and keeps what it answers.
        def counted(choices_):
            rounds.append(op)
            return benchmark(choices_)

        timings = patched(self, choices, op, inputs, counted if benchmark is not None else None, hint_override)
        named = {choice.hash_key(): float(timing) for choice, timing in timings.items()}
        best = min(named, key=named.get) if named else None
        lookups.append({"op": op, "inputs": inputs, "best": best, "timings": named})
        return timings

    codecache.PersistentCache.lookup = counting_lookup
    inductor_config.max_autotune_gemm_backends = "CPP,ATEN"
    # Frozen weights are what the C++ GEMM template needs; an unfrozen graph is the FX graph cache's
    # (freezing bypasses it), whose remote cache the drop-in turns on.
    inductor_config.freezing = not spec.get("remote_fx")
    torch.manual_seed(0)

    if spec.get("barrier"):
        print("ready", flush=True)
        sys.stdin.read()

    started = time.monotonic()
    for in_features, out_features, batch in spec["shapes"]:
        torch._dynamo.reset()
        model = torch.nn.Linear(in_features, out_features).eval()
        with torch.no_grad():
            compiled = torch.compile(model, mode="max-autotune")
            compiled(torch.randn(batch, in_features))
    elapsed = time.monotonic() - started
    report = {
        "pid": os.getpid(),
        "rounds": len(rounds),
        "lookups": lookups,
        "seconds": elapsed,
        "ended": time.time(),
        "lookup_class": type(codecache.PersistentCache).__name__,
        "dropin": getattr(patched, "_tunecache", False),
    }
    if spec.get("counters"):
        report["counters"] = {group: dict(values) for group, values in counters.items()}
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
