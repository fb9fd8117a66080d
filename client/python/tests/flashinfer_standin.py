# Owns the package tree the FlashInfer drop-in tests import: FlashInfer's OWN code, unchanged,
# from the flashinfer-python 0.7.2.post1 wheel (flashinfer/autotune_cache.py and
# flashinfer/autotuner/{__init__,autotuner,initializers}.py, which run_tests.sh extracts into
# $TUNECACHE_FLASHINFER_SOURCE; the two files under test are checked against their sha256 here),
# plus stand-ins, written by tunecache for these tests, of what that code imports and a CPU
# machine lacks: `torch` (tensors that are shapes and dtypes, a CUDA clock that the stand-in
# runners advance, events that read it, and `torch.distributed` over a directory of files: the
# process group of the tests, whose all_reduce and broadcast_object_list check that every rank
# makes the same collective in the same order and fail instead of hanging), `tqdm`, and the
# flashinfer modules outside the autotuner (`flashinfer/__init__`, `jit.core`'s logger, `jit.env`,
# `tllm_utils.delay_kernel`, `utils`, `version`, `tactics_blocklist`). Nothing of tunecache is
# imported by them.
from __future__ import annotations

import hashlib
import os
import shutil
import textwrap
from pathlib import Path

SOURCE_ENV = "TUNECACHE_FLASHINFER_SOURCE"
# sha256 of FlashInfer's files as the 0.7.2.post1 wheel holds them (the code under test).
PINNED = {
    "autotune_cache.py": "7be4f83162ce3afada8593f5acd863769356da74102e6762ece133548a4d8bda",
    "autotuner/autotuner.py": "e222f35f8b5a59a99a45fad627a79db8fc45fadc52b667e63b70c0968509109d",
}
THEIR_FILES = ["autotune_cache.py", "autotuner/__init__.py", "autotuner/autotuner.py", "autotuner/initializers.py"]

STANDINS = {
    "torch/__init__.py": '''
        """Stand-in of torch for FlashInfer's autotuner on a CPU (tunecache's tests)."""
        from torch import backends, cuda, distributed, version


        class dtype:
            def __init__(self, name):
                self.name = name

            def __repr__(self):
                return "torch." + self.name

            __str__ = __repr__


        for _name in ("float16", "bfloat16", "float32", "float64", "int8", "int32", "int64", "uint8", "float8_e4m3fn"):
            globals()[_name] = dtype(_name)


        class device:
            def __init__(self, type="cuda", index=None):
                self.type = type
                self.index = index


        class Size(tuple):
            pass


        class Tensor:
            is_cuda = True

            def __init__(self, shape, dtype=None, device="cuda", values=None):
                self.shape = Size(shape)
                self.dtype = dtype if dtype is not None else globals()["float16"]
                self.device = device
                self.values = list(values) if values is not None else [0]

            def size(self, dim=None):
                return self.shape if dim is None else self.shape[dim]

            def dim(self):
                return len(self.shape)

            def numel(self):
                count = 1
                for extent in self.shape:
                    count *= extent
                return count

            def element_size(self):
                return 2

            def item(self):
                return self.values[0]

            def clone(self):
                return Tensor(self.shape, self.dtype, self.device, self.values)

            def zero_(self):
                return self


        def _shape(shape):
            return tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else tuple(shape)


        def empty(*shape, dtype=None, device="cuda", **_):
            return Tensor(_shape(shape), dtype, device)


        zeros = ones = randn = rand = empty


        def tensor(values, dtype=None, device="cpu"):
            return Tensor((len(values),), dtype, device, values)
    ''',
    "torch/version.py": '''
        cuda = "12.8"
    ''',
    "torch/backends/__init__.py": '''
        from torch.backends import cudnn
    ''',
    "torch/backends/cudnn.py": '''
        def version():
            return 91000
    ''',
    "torch/cuda.py": '''
        """The CUDA side: a clock in milliseconds that the stand-in runners advance."""
        import contextlib
        import os

        _now_ms = [0.0]


        def advance(ms):
            _now_ms[0] += ms


        class OutOfMemoryError(RuntimeError):
            pass


        def is_current_stream_capturing():
            return False


        class Stream:
            device = "cuda"

            def synchronize(self):
                pass


        _stream = Stream()


        def current_stream(device=None):
            return _stream


        @contextlib.contextmanager
        def stream(_stream):
            yield


        class Event:
            def __init__(self, enable_timing=False, **_):
                self.at = None

            def record(self, stream=None):
                self.at = _now_ms[0]

            def elapsed_time(self, end):
                return end.at - self.at


        class CUDAGraph:
            def replay(self):
                pass


        @contextlib.contextmanager
        def graph(_graph, **_):
            yield


        def synchronize():
            pass


        def empty_cache():
            pass


        def is_available():
            return True


        def current_device():
            return 0


        def get_device_name(index=0):
            return os.environ.get("STANDIN_GPU", "NVIDIA H100 80GB HBM3")


        class _Properties:
            L2_cache_size = 50 * 1024 * 1024


        def get_device_properties(index=0):
            return _Properties()


        class _Runtime:
            def cudaGetLastError(self):
                return 0


        def cudart():
            return _Runtime()
    ''',
    "torch/distributed.py": '''
        """A process group over a directory: collective N of every rank is the file N/<rank>."""
        import os
        import pickle
        import time


        class ReduceOp:
            SUM = "sum"
            MAX = "max"


        class CollectiveMismatch(RuntimeError):
            pass


        class ProcessGroup:
            def __init__(self, directory, rank, world_size, timeout_s=60.0):
                self.directory = directory
                self.rank = rank
                self.world_size = world_size
                self.timeout_s = timeout_s
                self.calls = []

            def exchange(self, kind, payload):
                """Every rank's payload of this collective; fails (never hangs) when the ranks do
                not make the same collectives in the same order."""
                sequence = len(self.calls)
                self.calls.append(kind)
                step = os.path.join(self.directory, str(sequence))
                os.makedirs(step, exist_ok=True)
                temporary = os.path.join(step, f".{self.rank}.tmp")
                with open(temporary, "wb") as out:
                    pickle.dump((kind, payload), out)
                os.replace(temporary, os.path.join(step, str(self.rank)))
                deadline = time.monotonic() + self.timeout_s
                answers = []
                for rank in range(self.world_size):
                    path = os.path.join(step, str(rank))
                    while not os.path.exists(path):
                        if time.monotonic() > deadline:
                            raise CollectiveMismatch(f"collective {sequence} ({kind}): rank {rank} never came (deadlock)")
                        time.sleep(0.001)
                    with open(path, "rb") as answer:
                        answers.append(pickle.load(answer))
                kinds = {other for other, _ in answers}
                if kinds != {kind}:
                    raise CollectiveMismatch(f"collective {sequence}: the ranks made {sorted(kinds)}")
                return [payload for _, payload in answers]


        def get_backend(group=None):
            return "gloo"


        def get_rank(group=None):
            return group.rank


        def get_world_size(group=None):
            return group.world_size


        def get_global_rank(group, group_rank):
            return group_rank


        def all_reduce(tensor, op=ReduceOp.SUM, group=None):
            values = group.exchange("all_reduce " + op, tensor.values)
            combine = sum if op == ReduceOp.SUM else max
            tensor.values = [combine(column) for column in zip(*values)]


        def broadcast_object_list(object_list, src=0, group=None):
            sent = group.exchange("broadcast", list(object_list) if group.rank == src else None)
            object_list[:] = sent[src]
    ''',
    "tqdm/__init__.py": '''
        class tqdm:
            def __init__(self, *args, **kwargs):
                pass

            def update(self, n=1):
                pass

            def close(self):
                pass
    ''',
    "flashinfer/__init__.py": '''
        """Stand-in of the flashinfer package's __init__ (which loads every kernel module)."""
    ''',
    "flashinfer/jit/__init__.py": "",
    "flashinfer/jit/core.py": '''
        import logging

        logger = logging.getLogger("flashinfer")
    ''',
    "flashinfer/jit/env.py": '''
        import os
        import pathlib

        FLASHINFER_CACHE_DIR = pathlib.Path(os.environ.get("FLASHINFER_CACHE_DIR", os.path.expanduser("~/.cache/flashinfer")))
    ''',
    "flashinfer/tllm_utils.py": '''
        def delay_kernel(microseconds):
            pass
    ''',
    "flashinfer/utils.py": '''
        def next_positive_power_of_2(x):
            return 1 if x < 1 else 1 << (x - 1).bit_length()


        def is_confidential_compute():
            return False


        def get_globaltimer_kernel():
            return None
    ''',
    "flashinfer/version.py": '''
        __version__ = "0.7.2.post1"
    ''',
    "flashinfer/tactics_blocklist.py": '''
        class TacticsBlocklist:
            def load(self, path):
                pass

            def filter(self, custom_op, runner, tactics):
                return list(tactics)
    ''',
}


def their_source() -> Path:
    """Where run_tests.sh extracted FlashInfer's files (checked), or None when it did not."""
    source = os.environ.get(SOURCE_ENV, "")
    if not source or not (Path(source) / "flashinfer" / "autotune_cache.py").is_file():
        return None
    return Path(source)


def write_standin(root: Path, source: Path) -> Path:
    """The importable tree under ``root``: FlashInfer's files from ``source`` (pinned) and the
    stand-ins above. Returns ``root`` (for PYTHONPATH)."""
    for name in THEIR_FILES:
        origin = source / "flashinfer" / name
        if name in PINNED:
            digest = hashlib.sha256(origin.read_bytes()).hexdigest()
            assert digest == PINNED[name], f"{origin}: sha256 {digest}, not FlashInfer 0.7.2.post1's"
        target = root / "flashinfer" / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(origin, target)
    for name, text in STANDINS.items():
        target = root / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(textwrap.dedent(text).lstrip())
    return root
