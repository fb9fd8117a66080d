# Owns one BitBLAS rank process for the drop-in tests: it imports the stand-in (bitblas_standin.py,
# from PYTHONPATH), installs the drop-in unless told not to (or leaves it to TUNECACHE_BITBLAS=1),
# runs BitBLAS's own code for its mode, and prints on its last stdout line, as JSON, what it holds:
# per operator its config, the build id its dlopened wrapper library answers, the kernel source
# its runtime module answers (from the dlopened .tar.so when loaded), the bytes of every file of
# its directory, whether the drop-in loaded it, and whether this process tuned.
#   seed:   the seed report's thread body as a process: Matmul(enable_tuning=False), add,
#           save_into_database(path, target), clear, load_from_database(path, target)
#   load:   load_from_database(path, target) (or load_global_ops_cache with "global")
#   linear: bitblas.Linear(..., enable_tuning=True), i.e. Linear._get_or_create_bitblas_operator
#   ladder: a LadderPermutate tuned, added and saved (bitblas does not export it)
from __future__ import annotations

import ctypes
import hashlib
import json
import logging
import os
import sys


def file_digests(directory):
    digests = {}
    for name in sorted(os.listdir(directory)):
        path = os.path.join(directory, name)
        if os.path.isfile(path):
            with open(path, "rb") as f:
                digests[name] = hashlib.sha256(f.read()).hexdigest()
    return digests


def describe(config, op):
    op.lib.standin_build_id.restype = ctypes.c_char_p
    op.lib.initialized.restype = ctypes.c_int
    return {
        "config": repr(config),
        "build_id": op.lib.standin_build_id().decode(),
        "lib_initialized": op.lib.initialized(),
        "kernel": op.rt_mod.imported_modules[0].get_source() if op.rt_mod is not None else None,
        "libpath": op.libpath,
        "lib_sha": hashlib.sha256(open(op.libpath, "rb").read()).hexdigest(),
        "src_sha": hashlib.sha256(open(op.srcpath, "rb").read()).hexdigest() if op.srcpath else None,
        "dir_files": file_digests(os.path.dirname(op.libpath)) if op.libpath else {},
        "loaded_by_dropin": bool(getattr(op, "_tunecache_loaded", False)),
    }


def main() -> None:
    spec = json.loads(sys.argv[1])
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s:%(name)s:%(message)s", stream=sys.stderr)
    import bitblas
    from bitblas.cache import global_operator_cache, load_global_ops_cache
    from bitblas.ops import operator as standin_operator

    if spec.get("install", True):
        import tunecache.integrations.bitblas as tb

        tb.install()
    import tunecache.integrations.bitblas as tb_check

    target = spec.get("target") or bitblas.auto_detect_nvidia_target()
    config = bitblas.MatmulConfig(M=spec.get("M", 1), N=1024, K=1024, A_dtype="float16", out_dtype="float16",
                                  accum_dtype="float16", layout="nt")
    mode = spec["mode"]
    ops = {}
    if mode == "seed":
        # "target_object": a Target, whose save their cache names by the operator's target (a
        # Target passed to save_into_database would not be a directory name).
        made_with = bitblas.tvm.target.Target(target) if spec.get("target_object") else target
        matmul = bitblas.Matmul(config=config, target=made_with, enable_tuning=False)
        global_operator_cache.add(matmul.config, matmul)
        saved = describe(matmul.config, matmul)
        global_operator_cache.save_into_database(spec["path"], target=None if spec.get("target_object") else target)
        global_operator_cache.clear()
        assert global_operator_cache.size() == 0
        global_operator_cache.load_from_database(spec["path"], target=made_with)
        assert global_operator_cache.size() > 0, "the seed's check: the reload is empty"
        ops["saved"] = saved
    elif mode == "load":
        if spec.get("global"):
            load_global_ops_cache(spec["path"], target)
        else:
            global_operator_cache.load_from_database(spec["path"], target=target)
        if spec.get("save_after"):  # what a later save of a rank that only loaded sends
            global_operator_cache.save_into_database(spec["path"], target=target)
    elif mode == "linear":
        layer = bitblas.Linear(1024, 1024, opt_M=spec.get("M", 1), enable_tuning=True)
        ops["linear"] = describe(layer.bitblas_matmul.config, layer.bitblas_matmul)
    elif mode == "ladder":  # an operator their loader cannot build back: tuned and saved as stock
        from bitblas.ops.ladder_permutate import LadderPermutate, LadderPermutateConfig

        ladder_config = LadderPermutateConfig(M=1024, N=1024)
        permutate = LadderPermutate(ladder_config, target=target, enable_tuning=True)
        global_operator_cache.add(ladder_config, permutate)
        global_operator_cache.save_into_database(spec["path"], target=target)
    else:
        raise SystemExit(f"unknown mode {mode}")
    cache = [describe(c, op) for c, op in global_operator_cache.cache.items()]
    print(json.dumps({
        "pid": os.getpid(),
        "installed": tb_check.installed(),
        "tunings": len(standin_operator.TUNINGS),
        "ops": ops,
        "cache": cache,
    }))


if __name__ == "__main__":
    main()
