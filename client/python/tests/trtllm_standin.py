# Owns the stand-in of TensorRT-LLM's autotuner cache that the drop-in tests run against:
# TensorRT-LLM needs a GPU and is not installable here, so the tests write a small
# `tensorrt_llm` package whose `_torch.autotuner` module behaves as TensorRT-LLM's own
# AutoTunerProfilingCache does in the newest public copy read for issue 26 (a fork of
# NVIDIA/TensorRT-LLM at 7603e2ef7fb84533c9d6a935041b20e0a702c78c, see docs/integrations.md):
# `shared` plus `rank_N` sections, a `<file>.lock` sidecar (fcntl.lockf) taken by readers and
# writers, an atomic write-and-rename, `independent_op` (the non-INDEPENDENT ops, filled from
# the shared section's key[0] on load), `excluded_op`, enum tactics saved as their value, a load
# that replaces the in-memory cache, and a loader that skips keys and tactics it cannot
# literal_eval. Written from a reading of that code, not copied, and kept as that code is: its
# loader keeps an entry whose min_time is inf, as theirs does, although their autotuner never
# stores one (`AutoTuner._profile_runners` caches a tactic only when its measured average beat
# inf; checked again for issue 35 in NVIDIA/TensorRT-LLM's tensorrt_llm/_torch/autotuner.py),
# which is why the drop-in and the CLI refuse such entries. Nothing of tunecache is imported by it.
from __future__ import annotations

import textwrap
from pathlib import Path

LOGGER_SOURCE = textwrap.dedent(
    '''
    """Stand-in of tensorrt_llm.logger: the standard logger plus warning_once."""
    import logging

    _logger = logging.getLogger("tensorrt_llm")


    class _Logger:
        def __init__(self):
            self._once = set()

        def __getattr__(self, name):
            return getattr(_logger, name)

        def warning_once(self, message, key=None):
            key = message if key is None else key
            if key not in self._once:
                self._once.add(key)
                _logger.warning(message)


    logger = _Logger()
    '''
)

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
    from tensorrt_llm.logger import logger


    class DistributedTuningStrategy(enum.Enum):
        BROADCAST = "broadcast"
        INDEPENDENT = "independent"
        MERGE = "merge"
        PARALLEL = "parallel"


    class Mapping:
        def __init__(self):
            self.rank = int(os.environ.get("STANDIN_RANK", "0"))


    @contextlib.contextmanager
    def _exclusive_cache_lock(lock_path):
        # A POSIX record lock on a separate, persistent lock file, for readers and writers alike.
        lock_path.parent.mkdir(parents=True, exist_ok=True)
        descriptor = os.open(lock_path, os.O_CREAT | os.O_RDWR, 0o644)
        try:
            fcntl.lockf(descriptor, fcntl.LOCK_EX)
            yield
        finally:
            try:
                fcntl.lockf(descriptor, fcntl.LOCK_UN)
            finally:
                os.close(descriptor)


    class AutoTunerProfilingCache:
        SHARED_CACHE_KEY = "shared"

        def __init__(self):
            self.cache = dict()
            # Despite the name: the ops whose strategy is NOT independent (their entries are
            # saved to the shared section). choose_one() adds to it; load_cache() refills it.
            self.independent_op = set()
            self.excluded_op = set()
            self.lib_version = tensorrt_llm.__version__
            self.creation_timestamp = time.time()
            # torch.cuda.get_device_name() / get_device_capability() on a real GPU.
            self.device_name = os.environ.get("STANDIN_DEVICE_NAME", "NVIDIA H200")
            major, minor = os.environ.get("STANDIN_DEVICE_CAPABILITY", "9.0").split(".")
            self.device_capability = (int(major), int(minor))

        def __setitem__(self, cache_key, value):
            self.cache[cache_key] = value

        def __getitem__(self, cache_key):
            return self.cache[cache_key]

        def __len__(self):
            return len(self.cache)

        def clear(self):
            self.cache.clear()
            self.independent_op.clear()
            self.excluded_op.clear()

        def merge_cache_data(self, cache_data):
            self.cache.update(cache_data)

        def add_independent_op(self, custom_op, strategy):
            if strategy != DistributedTuningStrategy.INDEPENDENT:
                self.independent_op.add(custom_op)

        def add_excluded_op(self, custom_op):
            self.excluded_op.add(custom_op)

        def _partition_cache_by_strategy(self):
            shared, own = {}, {}
            for key, value in self.cache.items():
                custom_op = key[0]
                if custom_op in self.excluded_op:
                    continue
                (shared if custom_op in self.independent_op else own)[key] = value
            return shared, own

        def save_cache(self, file_path, rank):
            file_path = Path(file_path)
            file_path.parent.mkdir(parents=True, exist_ok=True)
            try:
                shared, own = self._partition_cache_by_strategy()
                serialized_shared = self._serialize_cache_data(shared)
                serialized_own = self._serialize_cache_data(own)
                with _exclusive_cache_lock(self._lock_path_for(file_path)):
                    current = self._read_existing_cache(file_path)
                    current.setdefault(self.SHARED_CACHE_KEY, {}).update(serialized_shared)
                    # Merged, not replaced: what this rank saved before stays.
                    current.setdefault(f"rank_{rank}", {}).update(serialized_own)
                    self._atomic_write_json(file_path, current)
                logger.info(f"[AutoTuner] Successfully saved cache to {file_path} using JSON format")
            except Exception as e:
                logger.error(f"[AutoTuner] Failed to save cache with JSON: {e}")
                raise

        @staticmethod
        def _lock_path_for(file_path):
            return file_path.with_name(file_path.name + ".lock")

        def _read_existing_cache(self, file_path):
            if not file_path.exists():
                return {"metadata": self._serialize_metadata()}
            try:
                content = file_path.read_text()
                if not content.strip():
                    return {"metadata": self._serialize_metadata()}
                return json.loads(content)
            except (FileNotFoundError, json.JSONDecodeError) as e:
                logger.warning(f"[AutoTuner] Could not parse existing cache at {file_path}: {e!r}")
                return {"metadata": self._serialize_metadata()}

        @staticmethod
        def _atomic_write_json(file_path, payload):
            temporary = file_path.with_name(f".{file_path.name}.tmp.{os.getpid()}.{time.time_ns()}")
            with open(temporary, "w") as f:
                json.dump(payload, f, indent=2, default=str)
                f.flush()
                os.fsync(f.fileno())
            os.rename(temporary, file_path)

        def load_cache(self, file_path, rank):
            file_path = Path(file_path)
            if not file_path.exists():
                raise FileNotFoundError(f"Cache file not found: {file_path}")
            try:
                with _exclusive_cache_lock(self._lock_path_for(file_path)):
                    with open(file_path) as f:
                        contents = json.load(f)
                self._deserialize_metadata(contents.get("metadata", {}))
                # The file replaces what the process held.
                self.cache = {}
                self.independent_op = set()
                if self.SHARED_CACHE_KEY in contents:
                    shared = self._deserialize_cache_data(contents[self.SHARED_CACHE_KEY])
                    self.cache.update(shared)
                    for key in shared.keys():
                        self.independent_op.add(key[0])
                if f"rank_{rank}" in contents:
                    self.cache.update(self._deserialize_cache_data(contents[f"rank_{rank}"]))
                logger.info(f"[AutoTuner] Successfully loaded cache from {file_path} (total {len(self.cache)} entries)")
            except Exception as e:
                logger.error(f"[AutoTuner] Failed to load cache with JSON: {e}")
                raise

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

        def _serialize_cache_data(self, cache=None):
            if cache is None:
                cache = self.cache
            serialized = {}
            for key, (runner_id, tactic, min_time) in cache.items():
                key_str = str(key)
                # An enum tactic is saved as its value (its repr is no literal).
                value = tactic.value if isinstance(tactic, enum.Enum) else tactic
                tactic_str = repr(value)
                try:
                    assert value == ast.literal_eval(tactic_str)
                except Exception as e:
                    logger.warning_once(
                        f"[AutoTuner] Could not serialize tactic: {tactic_str} for cache key {key_str} due to {e}. Deserialization may fail.",
                        key=tactic_str)
                serialized[key_str] = {"runner_id": runner_id, "tactic": tactic_str, "min_time": min_time}
            return serialized

        def _deserialize_cache_data(self, cache_data):
            cache = {}
            for key_str, value in cache_data.items():
                try:
                    key = ast.literal_eval(key_str)
                except (ValueError, SyntaxError):
                    logger.warning(f"[AutoTuner] Could not reconstruct cache key: {key_str}")
                    continue
                try:
                    tactic = ast.literal_eval(value["tactic"])
                except (ValueError, TypeError, SyntaxError):
                    logger.warning_once(
                        f"[AutoTuner] Could not deserialize tactic: {value['tactic']} for cache key {key_str}; skipping entry.",
                        key=value["tactic"])
                    continue
                cache[key] = (value["runner_id"], tactic, value["min_time"])
            return cache


    class AutoTuner:
        _instance = None

        def __init__(self):
            self.profiling_cache = AutoTunerProfilingCache()
            self.is_tuning_mode = False
            self.mapping = Mapping()

        @classmethod
        def get(cls):
            if cls._instance is None:
                cls._instance = AutoTuner()
            return cls._instance


    @contextlib.contextmanager
    def autotune(tune_mode: bool = True, cache_path: str = None, skip_dynamic_tuning_buckets: bool = False):
        autotuner = AutoTuner.get()
        rank = autotuner.mapping.rank
        if cache_path is not None and os.path.exists(cache_path):
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
    (package / "logger.py").write_text(LOGGER_SOURCE)
    (package / "_torch" / "__init__.py").write_text("")
    (package / "_torch" / "autotuner.py").write_text(AUTOTUNER_SOURCE)
    (package / "_torch" / "pyexecutor" / "__init__.py").write_text("")
    (package / "_torch" / "pyexecutor" / "warmup.py").write_text(WARMUP_SOURCE)
    return root
