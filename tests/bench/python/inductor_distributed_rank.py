# Owns one rank of the `stock-distributed` mode of inductor_tune.py: stock Inductor with
# TORCHINDUCTOR_DISTRIBUTED_MAX_AUTOTUNE_GEMM=1 (set by the driver) inside a torch.distributed
# process group on the CPU (gloo, rendezvous through a FileStore), running the same rank as every
# other mode (client/python/tests/inductor_rank.py, its spec unchanged). Inductor's distributed
# autotune hands a GEMM to one rank of the group through distributed_autotune.
# maybe_autotune_remote(); this wrapper counts its calls and how many it handed to another rank,
# so the benchmark says from what Inductor did, not from its source, whether the mode applied.
#
# Arguments: RANK WORLD_SIZE STORE_PATH SPEC_JSON. Prints what inductor_rank.py prints, then one
# more JSON line: {"distributed": {"rank", "world_size", "calls", "remote", "backend", "errors"}}.
from __future__ import annotations

import json
import runpy
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[3]
RANK_SCRIPT = REPO_ROOT / "client" / "python" / "tests" / "inductor_rank.py"


def main() -> None:
    rank, world_size, store_path, spec = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    import torch.distributed as dist
    from torch._inductor import config, distributed_autotune

    store = dist.FileStore(store_path, world_size)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size)
    counts = {"rank": rank, "world_size": world_size, "backend": dist.get_backend(),
              "enabled": bool(config.distributed_max_autotune_gemm), "calls": 0, "remote": 0, "errors": []}
    stock = distributed_autotune.maybe_autotune_remote

    def counted(name, choices, inputs, layout):
        counts["calls"] += 1
        try:
            box = stock(name, choices, inputs, layout)
        except Exception as err:  # noqa: BLE001 - reported, then raised as Inductor would
            counts["errors"].append(f"{type(err).__name__}: {err}")
            raise
        if box is not None:
            counts["remote"] += 1
        return box

    distributed_autotune.maybe_autotune_remote = counted
    sys.argv = [str(RANK_SCRIPT), spec]
    try:
        runpy.run_path(str(RANK_SCRIPT), run_name="__main__")
    finally:
        print(json.dumps({"distributed": counts}), flush=True)
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
