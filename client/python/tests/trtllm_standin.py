# Owns the stand-in of TensorRT-LLM's autotuner cache that the drop-in tests run against:
# TensorRT-LLM needs a GPU and is not installable here, so the tests write a small
# `tensorrt_llm` package whose `_torch.autotuner` module follows the documented behaviour of
# AutoTunerProfilingCache (file layout, str(tuple) keys and repr tactics read back with
# ast.literal_eval, min_time in ms, rank sections, shared section, writer lock and rename) and of
# the autotune(cache_path=...) context manager. Nothing of tunecache is imported by it.
from __future__ import annotations

import textwrap
from pathlib import Path

AUTOTUNER_SOURCE = textwrap.dedent(
    '''
    """Stand-in of tensorrt_llm._torch.autotuner (cache persistence and autotune() only)."""
    import ast
    import contextlib
    import enum
    import fcntl
    import json
    import os
    import time
    from pathlib import Path

    import tensorrt_llm

    LOCK_TIMEOUT_S = float(os.environ.get("TLLM_AUTOTUNER_CACHE_LOCK_TIMEOUT", "120"))


    class DistributedTuningStrategy(enum.Enum):
        BROADCAST = "broadcast"
        INDEPENDENT = "independent"
        MERGE = "merge"
        PARALLEL = "parallel"


    class Mapping:
        def __init__(self):
            self.rank = int(os.environ.get("STANDIN_RANK", "0"))


    class AutoTunerProfilingCache:
        def __init__(self):
            self.cache = dict()
            self.lib_version = tensorrt_llm.__version__
            self.creation_timestamp = time.time()
            # torch.cuda.get_device_name() / get_device_capability() on a real GPU.
            self.device_name = os.environ.get("STANDIN_DEVICE_NAME", "NVIDIA H200")
            major, minor = os.environ.get("STANDIN_DEVICE_CAPABILITY", "9.0").split(".")
            self.device_capability = (int(major), int(minor))

        def _is_shared(self, custom_op):
            strategy = AutoTuner.get()._map_op_to_distributed_strategy.get(custom_op)
            return strategy is not None and strategy != DistributedTuningStrategy.INDEPENDENT

        def save_cache(self, file_path, rank):
            """Writer: under <file>.lock, read the file, replace this rank's section and merge the
            shared one, write a temporary file and rename it over the cache."""
            file_path = Path(file_path)
            file_path.parent.mkdir(parents=True, exist_ok=True)
            shared = {k: v for k, v in self.cache.items() if self._is_shared(k[0])}
            own = {k: v for k, v in self.cache.items() if not self._is_shared(k[0])}
            with open(str(file_path) + ".lock", "a") as lock:
                deadline = time.monotonic() + LOCK_TIMEOUT_S
                while True:
                    try:
                        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                        break
                    except BlockingIOError:
                        if time.monotonic() > deadline:
                            raise TimeoutError(f"{file_path}.lock")
                        time.sleep(0.01)
                try:
                    with open(file_path) as f:
                        current = json.load(f)
                except (FileNotFoundError, ValueError):
                    current = {"metadata": self._serialize_metadata()}
                current.setdefault("shared", {}).update(self._serialize_cache_data(shared))
                current[f"rank_{rank}"] = self._serialize_cache_data(own)
                temporary = f"{file_path}.tmp.{os.getpid()}"
                with open(temporary, "w") as f:
                    json.dump(current, f, indent=2, default=str)
                os.replace(temporary, file_path)

        def load_cache(self, file_path, rank):
            """Reader: no lock (writers rename); shared entries, then the rank's own; merged into
            the in-memory cache, the file winning."""
            file_path = Path(file_path)
            if not file_path.exists():
                raise FileNotFoundError(f"Cache file not found: {file_path}")
            with open(file_path) as f:
                contents = json.load(f)
            self._deserialize_metadata(contents["metadata"])
            self.cache.update(self._deserialize_cache_data(contents.get("shared", {})))
            self.cache.update(self._deserialize_cache_data(contents.get(f"rank_{rank}", {})))

        def _serialize_metadata(self):
            return {
                "lib_version": self.lib_version,
                "creation_timestamp": self.creation_timestamp,
                "device_name": self.device_name,
                "device_capability": self.device_capability,
            }

        def _deserialize_metadata(self, metadata):
            self.lib_version = metadata["lib_version"]
            self.creation_timestamp = metadata["creation_timestamp"]
            self.device_name = metadata["device_name"]
            self.device_capability = metadata["device_capability"]

        def _serialize_cache_data(self, cache):
            serialized = {}
            for key, (runner_id, tactic, min_time) in cache.items():
                serialized[str(key)] = {"runner_id": runner_id, "tactic": repr(tactic), "min_time": min_time}
            return serialized

        def _deserialize_cache_data(self, cache_data):
            cache = {}
            for key_str, value in cache_data.items():
                key = ast.literal_eval(key_str)
                tactic = ast.literal_eval(value["tactic"])
                cache[key] = (value["runner_id"], tactic, value["min_time"])
            return cache


    class AutoTuner:
        _instance = None

        def __init__(self):
            self.profiling_cache = AutoTunerProfilingCache()
            self.is_tuning_mode = False
            self._map_op_to_distributed_strategy = {}
            self.mapping = Mapping()

        @classmethod
        def get(cls):
            if cls._instance is None:
                cls._instance = AutoTuner()
            return cls._instance


    @contextlib.contextmanager
    def autotune(tune_mode: bool = True, cache_path: str = None):
        autotuner = AutoTuner.get()
        rank = autotuner.mapping.rank
        if cache_path is not None:
            if os.path.exists(cache_path):
                autotuner.profiling_cache.load_cache(cache_path, rank)
        old_mode = autotuner.is_tuning_mode
        autotuner.is_tuning_mode = tune_mode
        try:
            yield
        finally:
            autotuner.is_tuning_mode = old_mode
            if cache_path is not None:
                autotuner.profiling_cache.save_cache(cache_path, rank)
    '''
)

# A module of TensorRT-LLM's own that binds autotune by name at import, before user code runs.
WARMUP_SOURCE = textwrap.dedent(
    '''
    from tensorrt_llm._torch.autotuner import AutoTuner, autotune


    def warmup(cache_path):
        with autotune(cache_path=cache_path):
            return dict(AutoTuner.get().profiling_cache.cache)
    '''
)


def write_standin(root: Path, version: str = "1.1.0") -> Path:
    """Writes the `tensorrt_llm` stand-in package under root; returns root (for sys.path)."""
    package = root / "tensorrt_llm"
    (package / "_torch" / "pyexecutor").mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text(
        f'import os\n__version__ = os.environ.get("STANDIN_TRTLLM_VERSION", {version!r})\n'
    )
    (package / "_torch" / "__init__.py").write_text("")
    (package / "_torch" / "autotuner.py").write_text(AUTOTUNER_SOURCE)
    (package / "_torch" / "pyexecutor" / "__init__.py").write_text("")
    (package / "_torch" / "pyexecutor" / "warmup.py").write_text(WARMUP_SOURCE)
    return root
