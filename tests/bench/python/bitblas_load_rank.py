# Owns one rank of the BitBLAS load benchmark (bitblas_load.py): with the BitBLAS stand-in of
# client/python/tests/bitblas_standin.py on PYTHONPATH it imports bitblas (and, for "dropin",
# installs tunecache.integrations.bitblas), prints "ready", waits for EOF on stdin (the barrier),
# then runs BitBLAS's own load_from_database(PATH, TARGET) and prints one JSON line: the load's
# seconds, when it ended (time.time()), how many operators it holds, how many have their runtime
# module (TVM's load_module of their tvm_rt_mod.tar can fail when another rank unpacks the same
# directory at once: stock BitBLAS logs it and keeps the operator without one) and how many have
# their wrapper library dlopened, and the exception their load raised, if any (their os.walk can
# meet another rank's unpacking directory just as it is removed).
#
# Run by the harness as: python bitblas_load_rank.py MODE PATH TARGET
import json
import sys
import time

mode, path, target = sys.argv[1], sys.argv[2], sys.argv[3]
import logging  # noqa: E402

logging.basicConfig(level=logging.CRITICAL)
import bitblas  # noqa: E402,F401
from bitblas.cache import global_operator_cache  # noqa: E402

if mode == "dropin":
    import tunecache.integrations.bitblas as tb

    tb.install()

print("ready", flush=True)
sys.stdin.read()
started = time.perf_counter()
error = None
try:
    global_operator_cache.load_from_database(path, target)
except Exception as err:  # stock: another rank's unpacking directory vanished under their os.walk
    error = f"{type(err).__name__}: {err}"
seconds = time.perf_counter() - started
ops = list(global_operator_cache.cache.values())
print(json.dumps({
    "load_s": seconds,
    "ended": time.time(),
    "ops": len(ops),
    "with_rt_mod": sum(1 for op in ops if op.rt_mod is not None),
    "with_lib": sum(1 for op in ops if op.lib is not None),
    "error": error,
}), flush=True)
