# Owns one FlashInfer rank process for the drop-in tests and the benchmark: with the stand-in tree
# on PYTHONPATH (flashinfer_standin.py: FlashInfer's own autotuner and store, stand-in torch), it
# turns the drop-in on as the spec says (install(), TUNECACHE_FLASHINFER=1, or not at all), runs
# FlashInfer's autotune_v2() over stand-in runners and shapes (optionally in a stand-in process
# group), and prints, as JSON on its last stdout line, each key's chosen runner and tactic, the
# profiles it ran, how long each op took and the store class that served it.
#
# Spec (JSON, the one argument): root (the store's cache_root), ops ([{"name", "runners": [class
# names]}]), shapes ([m, ...]), mode ("tune" | "replay"), dropin ("install" | "env" | "none"),
# profile_ms (the stand-in profile of one key, spread over the op's runners), group (optional:
# {"dir", "rank", "world_size"}), preload_only (optional: print their store's preload()), barrier
# (optional: print "ready", then start when stdin closes).
from __future__ import annotations

import json
import os
import random
import sys
import time

# Runner costs in stand-in GPU milliseconds per tactic. Every "Gemm" tactic costs the same, so the
# winner is decided by this process's timing noise: ranks that profile on their own disagree.
# "Slow" runners always lose to "Fast" (the three-runner ops' winner is their last runner).
# "FastX" is "Fast" with cache-key extras of its own, ("x",): its key is in an op unit of its own.
COSTS = {"Gemm": {0: 1.0, 1: 1.0, 2: 1.0, 3: 1.0}, "SlowA": {0: 5.0, 1: 5.0}, "SlowB": {0: 6.0}, "Fast": {0: 1.0, 1: 1.1},
         "FastX": {0: 1.0}}
FALLBACK_COST = 50.0
PROFILES = []


def make_runner(op_name, class_name, profile_s):
    from flashinfer.autotuner import TunableRunner
    import torch

    noise = random.Random(os.getpid() ^ time.monotonic_ns())

    def get_valid_tactics(self, inputs, profile):
        PROFILES.append([op_name, class_name, [list(shape) for shape in profile.get_opt_shapes()]])
        time.sleep(profile_s)
        return list(COSTS[class_name])

    def forward(self, inputs, tactic=-1, do_preparation=False, **kwargs):
        cost = COSTS[class_name].get(tactic, FALLBACK_COST)
        torch.cuda.advance(cost * noise.uniform(0.8, 1.2))
        return None

    def get_cache_key_extras(self, inputs):
        return ("x",) if class_name.endswith("X") else ()

    return type(class_name, (TunableRunner,), {"get_valid_tactics": get_valid_tactics, "forward": forward,
                                               "get_cache_key_extras": get_cache_key_extras})()


def main() -> None:
    spec = json.loads(sys.argv[1])
    if spec.get("dropin") == "install":
        import tunecache.integrations.flashinfer as drop_in

        drop_in.install()
        assert "flashinfer" not in sys.modules, "install() imported FlashInfer"
    import torch
    from flashinfer.autotune_cache import autotune_v2, ManagedAutotuneCache
    from flashinfer.autotuner import AutoTuner, TuningConfig, set_autotune_process_group

    tuner = AutoTuner.get()
    tuner.warmup, tuner.repeat = 0, 1
    group = None
    if spec.get("group"):
        g = spec["group"]
        group = torch.distributed.ProcessGroup(g["dir"], g["rank"], g["world_size"])
        set_autotune_process_group(group)
    if spec.get("preload_only"):
        store = ManagedAutotuneCache(tuner_manifest(), spec["root"])
        entries, total, skipped = store.preload()
        print(json.dumps({"preload": [[repr(fields), list(entry)] for fields, entry in entries], "total": total,
                          "skipped": skipped}))
        return
    chosen, op_seconds = {}, []
    config = TuningConfig()
    if spec.get("barrier"):  # the benchmark's: every rank imported and ready, then released at once
        print("ready", flush=True)
        sys.stdin.read()
    started = time.monotonic()
    with autotune_v2(mode=spec.get("mode", "tune"), cache_root=spec["root"]):
        store = tuner._managed_cache
        for op in spec["ops"]:
            runners = [make_runner(op["name"], name, spec["profile_ms"] / 1000 / len(op["runners"])) for name in op["runners"]]
            for m in spec["shapes"]:
                inputs = [torch.empty((m, 64)), torch.empty((64, 64))]
                op_started = time.monotonic()
                runner, tactic = tuner.choose_one(op["name"], runners, config, inputs)
                op_seconds.append(time.monotonic() - op_started)
                chosen[f"{op['name']} m={m}"] = [type(runner).__name__, tactic]
    print(json.dumps({
        "chosen": chosen,
        "profiles": PROFILES,
        "op_seconds": op_seconds,
        "wall_s": time.monotonic() - started,
        "ended": time.time(),
        "daemon_store": hasattr(store, "device"),
        "collectives": group.calls if group is not None else [],
    }))


def tuner_manifest():
    from flashinfer.autotuner import _collect_metadata

    return _collect_metadata()


if __name__ == "__main__":
    main()
