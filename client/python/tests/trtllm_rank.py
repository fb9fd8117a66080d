# Owns one TensorRT-LLM rank process for the drop-in tests: it imports the stand-in autotuner
# (from PYTHONPATH), optionally installs the drop-in, saves or loads entries, and prints the
# resulting cache as canonical JSON (types and float bits spelled out) on its last stdout line.
from __future__ import annotations

import json
import logging
import os
import sys


def canonical(value):
    """A JSON form that tells apart every type and float bit pattern the cache can hold."""
    if isinstance(value, bool):
        return ["bool", value]
    if isinstance(value, int):
        return ["int", str(value)]
    if isinstance(value, float):
        return ["float", value.hex()]
    if isinstance(value, str):
        return ["str", value]
    if isinstance(value, bytes):
        return ["bytes", value.hex()]
    if value is None:
        return ["none"]
    if isinstance(value, tuple):
        return ["tuple", [canonical(item) for item in value]]
    if isinstance(value, list):
        return ["list", [canonical(item) for item in value]]
    if isinstance(value, (set, frozenset)):
        return ["set", sorted((canonical(item) for item in value), key=json.dumps)]
    if isinstance(value, dict):
        return ["dict", sorted(([canonical(k), canonical(v)] for k, v in value.items()), key=json.dumps)]
    raise TypeError(f"unexpected {type(value)}")


def dump(cache) -> list:
    return sorted(([canonical(key), canonical(value)] for key, value in cache.items()), key=json.dumps)


SHARED_OP = "trtllm::allreduce"
OWN_OP = "trtllm::fused_moe::gemm1"
TACTICS = [
    -1,
    7,
    2**70,
    (128, 'tile "a"'),
    {"tile": (64, 128), "stages": 3},
    b"\x00\xff",
    0.1,
    "it's",
    None,
    True,
    [1, (2, 3)],
    {1, 2},
    (),
]
MIN_TIMES = [5e-324, 1e-3, 0.1 + 0.2, 12.345678901234567, 1e300, 7, 0.0, 2.5e-05]


def entries(rank: int, cycle: int, count: int):
    """Deterministic cache entries: `count` of the rank's own op and `count` shared ones."""
    made = {}
    for i in range(count):
        n = cycle * count + i
        made[(OWN_OP, "MoERunner", "(0,)", ((n + 1, 4096), (4096, 4096 + rank)))] = (
            n % 3,
            TACTICS[(n + rank) % len(TACTICS)],
            MIN_TIMES[(n + rank) % len(MIN_TIMES)],
        )
        made[(SHARED_OP, "AllReduceRunner", "()", (n + 1, 8192))] = (
            0,
            TACTICS[n % len(TACTICS)],
            MIN_TIMES[n % len(MIN_TIMES)],
        )
    return made


def main() -> int:
    spec = json.loads(sys.argv[1])
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    from tensorrt_llm._torch import autotuner

    if spec.get("bind_before_install"):
        from tensorrt_llm._torch.pyexecutor import warmup  # binds autotune by name
    if spec.get("install"):
        import tunecache.integrations.trtllm as tt

        tt.install()
    tuner = autotuner.AutoTuner.get()
    tuner._map_op_to_distributed_strategy[SHARED_OP] = autotuner.DistributedTuningStrategy.BROADCAST
    tuner._map_op_to_distributed_strategy[OWN_OP] = autotuner.DistributedTuningStrategy.INDEPENDENT
    rank = tuner.mapping.rank
    path = spec["path"]
    mode = spec["mode"]
    count = spec.get("count", 10)
    if mode == "save":
        tuner.profiling_cache.cache.update(entries(rank, spec.get("cycle", 0), count))
        tuner.profiling_cache.save_cache(path, rank)
        result = dump(tuner.profiling_cache.cache)
    elif mode == "load":
        tuner.profiling_cache.load_cache(path, rank)
        result = dump(tuner.profiling_cache.cache)
    elif mode == "autotune":
        with autotuner.autotune(cache_path=path):
            result = dump(tuner.profiling_cache.cache)
    elif mode == "autotune_bound":
        from tensorrt_llm._torch.pyexecutor import warmup

        result = dump(warmup.warmup(path))
    elif mode == "cycles":
        # Save and reload many times; each reload must see everything this rank saved so far.
        expected = {}
        for cycle in range(spec["cycles"]):
            new = entries(rank, cycle, count)
            expected.update(new)
            saver = autotuner.AutoTunerProfilingCache()
            saver.cache.update(expected)
            saver.save_cache(path, rank)
            loader = autotuner.AutoTunerProfilingCache()
            loader.load_cache(path, rank)
            missing = [key for key, value in expected.items()
                       if key[0] == OWN_OP and canonical(loader.cache.get(key)) != canonical(value)]
            if missing:
                print(f"cycle {cycle}: {len(missing)} own entries missing or different, e.g. {missing[0]}")
                return 1
        result = dump(expected)
    else:
        raise SystemExit(f"unknown mode {mode}")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
