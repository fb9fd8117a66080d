# Owns one TensorRT-LLM rank process for the drop-in tests: it imports the stand-in autotuner
# (from PYTHONPATH), optionally installs the drop-in, saves or loads entries (with
# "faster_shared", shared entries that beat every earlier save of theirs: another job's better
# results), and prints the resulting cache, independent_op and metadata as canonical JSON (types
# and float bits spelled out) on its last stdout line.
from __future__ import annotations

import enum
import json
import logging
import math
import os
import sys


class Fp4QuantTactic(enum.IntEnum):
    """An IntEnum tactic, as TensorRT-LLM's FP4 quantize runners use."""

    TRTLLM = -1
    CUTEDSL = 1


class TileCfg(enum.Enum):
    """An Enum tactic whose value is a string."""

    SMALL = "small"
    LARGE = "large"


class Opaque:
    """A tactic whose repr is no Python literal: TensorRT-LLM's loader skips its entry."""

    def __repr__(self):
        return "Opaque(tile=64)"

    def __eq__(self, other):
        return isinstance(other, Opaque)

    def __hash__(self):
        return 1


def canonical(value):
    """A JSON form that tells apart every type and float bit pattern the cache can hold."""
    if isinstance(value, enum.Enum):
        return ["enum", type(value).__name__, value.name]
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
    if isinstance(value, Opaque):
        return ["opaque"]
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
# The value of every shared entry in a "faster_shared" save: a tactic no other save uses, in no
# time, so it beats every other save's shared entry n < 6 (MIN_TIMES[6] is 0.0 too).
FASTER_SHARED_VALUE = (0, "faster", 0.0)


def entries(rank: int, cycle: int, count: int, enums: bool = False, rejects: bool = False):
    """Deterministic cache entries: `count` of the rank's own op and `count` shared ones; with
    `enums`, an IntEnum and an Enum tactic for each; with `rejects`, entries TensorRT-LLM's
    loader skips (a tactic or a key that is no literal) and one it keeps (min_time inf)."""
    made = {}
    if enums:
        made[(OWN_OP, "Fp4QuantRunner", "(0,)", ((rank + 1, 16),))] = (0, Fp4QuantTactic.TRTLLM, 0.25)
        made[(SHARED_OP, "TileRunner", "()", ((7, 7),))] = (1, TileCfg.SMALL, 0.5)
    if rejects:
        made[(OWN_OP, "OpaqueRunner", "()", ((rank + 1, 1),))] = (0, Opaque(), 1.0)
        made[(OWN_OP, "NanRunner", "()", ((rank + 1, 2),))] = (0, float("nan"), 1.0)
        made[(OWN_OP, "InfKeyRunner", "()", ((rank + 1, math.inf),))] = (0, 3, 1.0)
        made[(SHARED_OP, "SlowRunner", "()", ((9, 9),))] = (0, 4, math.inf)
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

    def as_choose_one_would(profiling_cache):
        # choose_one() records each tuned op's strategy in the cache it tunes into.
        profiling_cache.add_independent_op(SHARED_OP, autotuner.DistributedTuningStrategy.BROADCAST)
        profiling_cache.add_independent_op(OWN_OP, autotuner.DistributedTuningStrategy.INDEPENDENT)

    rank = tuner.mapping.rank
    path = spec["path"]
    mode = spec["mode"]
    count = spec.get("count", 10)
    extra = {"enums": spec.get("enums", False), "rejects": spec.get("rejects", False)}
    if mode == "save":
        as_choose_one_would(tuner.profiling_cache)
        made = entries(rank, spec.get("cycle", 0), count, **extra)
        if spec.get("faster_shared"):
            made = {key: FASTER_SHARED_VALUE if key[0] == SHARED_OP else value for key, value in made.items()}
        tuner.profiling_cache.cache.update(made)
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
            as_choose_one_would(saver)
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
    profiling_cache = tuner.profiling_cache
    metadata = {name: getattr(profiling_cache, name) for name in
                ("lib_version", "creation_timestamp", "device_name", "device_capability")}
    print(json.dumps({
        "cache": result,
        "independent_op": sorted(getattr(profiling_cache, "independent_op", ())),
        "metadata": canonical(metadata),
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
