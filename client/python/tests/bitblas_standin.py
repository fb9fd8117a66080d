# Owns the stand-in of BitBLAS 0.1.0.post1 that the drop-in tests run against, and of the part of
# TVM it uses. The bitblas wheel imports only where torch (the CUDA build from PyPI: about 6 GB
# installed with its nvidia-* packages) is installed and a CUDA device answers through cudart at
# import (bitblas.base.base_scheduler calls auto_infer_current_arch() when its class is defined),
# which a stub libcuda.so.1 cannot give; see docs/bitblas.md. So the tests write a small `bitblas`
# and `tvm` package: `bitblas/cache/operator.py` and `bitblas/cache/__init__.py` are BitBLAS's own
# files, byte for byte (commit 22e25c9 of microsoft/BitBLAS, the files in the 0.1.0.post1 wheel;
# MIT licence, copyright Microsoft Corporation); `Linear._get_or_create_bitblas_operator` and
# `_configure_bitblas_matmul` are copied from their `bitblas/module/__init__.py` (the torch parts
# of Linear are left out); `Operator`, `Matmul`, `MatmulConfig` and the TVM pieces
# (`Target`, `runtime.load_module`, `contrib.tar`, `contrib.utils.tempdir`, `contrib.cc`,
# `contrib.nvcc.get_cuda_version`) follow theirs where the cache touches them. An operator's
# build is real: a C object file holding the kernel's source, packed by `tar -czf` as TVM's
# `export_library(..., fcompile=tar)` does and linked and dlopened again on load as TVM's
# `load_module` does (unpacking next to the tar with os.mkdir, so two loads from one directory
# collide as theirs do), and a wrapper shared library compiled by `cc` that is dlopened and whose
# `init()` is called, as their `update_runtime_module` does. Every build differs (its build id).
# Test knobs, all through the environment: STANDIN_BITBLAS_MARKS (a directory where each tuning
# leaves a file `tune-<pid>-<n>`; `hang-once` there makes the first tuner that claims it block
# forever, `hold` makes a tuner wait for `release`), STANDIN_BITBLAS_TARGET (what
# auto_detect_nvidia_target answers), STANDIN_BITBLAS_VERSION, STANDIN_CUDA_VERSION.
# Nothing of tunecache is imported by it.
from __future__ import annotations

import textwrap
from pathlib import Path

# --- BitBLAS's own files, byte for byte ------------------------------------------------------------
CACHE_OPERATOR_SOURCE = '''# Copyright (c) Microsoft Corporation.
# Licensed under the MIT License.
import bitblas
from bitblas.utils import get_default_cache_path
from bitblas.ops.operator import OperatorConfig, Operator
from dataclasses import asdict
import os
import json
import tempfile
from hashlib import sha256
import shutil
from bitblas import tvm
from tvm.contrib.tar import tar
import logging
import threading

logger = logging.getLogger(__name__)

BITBLAS_DATABASE_PATH = get_default_cache_path()
BITBLAS_WRAPPED_SOURCE_NAME = "wrapper_source.cu"
BITBLAS_WRAPPED_COMPILED_NAME = "wrapper_compiled.so"


class OperatorCache:
    """
    Manages a cache for operator instances (e.g., Matmul, Convolution) based on their configurations.
    """
    # A lock to synchronize access to the cache
    # RLock is used to allow reentrant locking
    # As load_from_database calls _load_operator which
    # calls _instantiate_and_add_operator
    cache_locker = threading.RLock()

    def __init__(self):
        self.cache = {}

    def add(self, config: OperatorConfig, op_inst: Operator):
        with self.cache_locker:
            self.cache[config] = op_inst

    def get(self, config: OperatorConfig):
        with self.cache_locker:
            return self.cache.get(config)

    def exists(self, config):
        return config in self.cache

    def clear(self):
        with self.cache_locker:
            self.cache.clear()

    def size(self):
        return len(self.cache)

    def save_into_database(self, database_path=None, target=None):
        with self.cache_locker:
            database_path = self._ensure_database_path(database_path)
            for config, op_inst in self.cache.items():
                arch_str = self._determine_arch_str(op_inst, target)
                arch_path = os.path.join(database_path, arch_str)
                self._ensure_directory(arch_path)
                hash_str = sha256(repr(config).encode()).hexdigest()
                config_path = os.path.join(arch_path, hash_str)
                # if the config already exists, skip saving
                if os.path.exists(config_path):
                    continue
                self._ensure_directory(config_path)
                self._save_operator_config_and_artifact(config, op_inst, config_path)

    def load_from_database(self, database_path, target=None):
        with self.cache_locker:
            if not os.path.exists(database_path):
                logger.info(
                    f"Database path {database_path} does not exist, skipping loading operators from the database"
                )
                return
            arch_str = self._determine_target_arch_str(target)
            arch_path = os.path.join(database_path, arch_str)
            if not os.path.exists(arch_path):
                logger.info(
                    f"Target {arch_str} does not exist in the database, skipping loading operators from the database"
                )
                return
            self._load_operators_from_arch_path(arch_path, target)

    def _ensure_database_path(self, database_path):
        if database_path is None:
            return tempfile.mkdtemp()
        os.makedirs(database_path, exist_ok=True)
        return database_path

    def _determine_arch_str(self, op_inst, target):
        return (target if target else "-".join(list(op_inst.target.keys) + [op_inst.target.arch]))

    def _ensure_directory(self, path):
        os.makedirs(path, exist_ok=True)

    def _save_operator_config_and_artifact(self, config, op_inst, config_path):
        config_type, operator_type = type(config).__name__, type(op_inst).__name__
        with open(os.path.join(config_path, f"{config_type}.json"), "w") as json_file:
            json.dump(asdict(config), json_file)
        artifact_path = os.path.join(config_path, "tvm_rt_mod." + tar.output_format)
        try:
            op_inst.rt_mod.export_library(artifact_path, fcompile=tar)
        except Exception as e:
            # library does not support export_library
            export_error = e  # noqa: F841
            pass
        json_data = {"config_type": config_type, "operator_type": operator_type}
        json_file_path = os.path.join(config_path, "mapping.json")
        with open(json_file_path, "w") as json_file:
            json.dump(json_data, json_file)

        # For writing source.cu file
        source_file_path = os.path.join(config_path, "source.cu")
        with open(source_file_path, "w") as source_file:
            source_file.write(op_inst.get_source())

        # For writing optimized.py file
        optimized_file_path = os.path.join(config_path, "optimized.py")
        with open(optimized_file_path, "w") as optimized_file:
            if op_inst.scheduled_ir_module is not None:
                optimized_file.write(op_inst.scheduled_ir_module.script(show_meta=False))
        if op_inst.libpath is not None:
            # copy lib name to the same directory as the artifact
            srcpath = op_inst.srcpath
            shutil.copy(
                srcpath,
                os.path.join(config_path, os.path.basename(BITBLAS_WRAPPED_SOURCE_NAME)),
            )
            libpath = op_inst.libpath
            shutil.copy(
                libpath,
                os.path.join(config_path, os.path.basename(BITBLAS_WRAPPED_COMPILED_NAME)),
            )

    def _determine_target_arch_str(self, target):
        return (target if isinstance(target, str) else "-".join(list(target.keys) + [target.arch]))

    def _load_operators_from_arch_path(self, arch_path, target):
        for root, dirs, _ in os.walk(arch_path):
            for directory in dirs:
                config_path = os.path.join(root, directory)
                self._load_operator(config_path, target)

    def _load_operator(self, config_path, target):
        mapping, config, rt_mod, srcpath, libpath = None, None, None, None, None
        for file in os.listdir(config_path):
            full_path = os.path.join(config_path, file)
            if file == "mapping.json":
                with open(full_path) as f:
                    mapping = json.load(f)
            elif file.endswith(".json"):
                with open(full_path) as f:
                    config = json.load(f)
            elif file.endswith(".tar"):
                try:
                    rt_mod = tvm.runtime.load_module(full_path)
                except Exception as e:
                    logger.error(f"Failed to load runtime module from {full_path}: {e}")
            elif file == BITBLAS_WRAPPED_COMPILED_NAME:
                libpath = full_path
            elif file == BITBLAS_WRAPPED_SOURCE_NAME:
                srcpath = full_path

        if mapping and config:
            self._instantiate_and_add_operator(mapping, config, rt_mod, srcpath, libpath, target)

    def _instantiate_and_add_operator(self, mapping, config, rt_mod, srcpath, libpath, target):
        config_cls = getattr(bitblas, mapping["config_type"])
        operator_cls = getattr(bitblas, mapping["operator_type"])
        op_inst = operator_cls(
            config=config_cls(**config),
            target=target,
            enable_tuning=False,
            from_database=True,
        )
        op_inst.update_runtime_module(rt_mod, srcpath=srcpath, libpath=libpath)
        self.add(config_cls(**config), op_inst)


global_operator_cache = OperatorCache()


def load_global_ops_cache(database_path=None, target=None):
    if database_path is None:
        database_path = get_database_path()
    if target is None:
        target = bitblas.auto_detect_nvidia_target()
    logger.info(f"Loading operators from database {database_path} for target {target}")
    global_operator_cache.load_from_database(database_path, target)
    return global_operator_cache


def get_database_path():
    return BITBLAS_DATABASE_PATH


def set_database_path(path):
    global BITBLAS_DATABASE_PATH
    BITBLAS_DATABASE_PATH = path
    return BITBLAS_DATABASE_PATH
'''

CACHE_INIT_SOURCE = '''# Copyright (c) Microsoft Corporation.
# Licensed under the MIT License.

from .operator import (
    global_operator_cache,  # noqa: F401
    load_global_ops_cache,  # noqa: F401
    get_database_path,  # noqa: F401
    set_database_path,  # noqa: F401
    OperatorCache,  # noqa: F401
)
'''

# --- the stand-ins ---------------------------------------------------------------------------------

BITBLAS_INIT_SOURCE = textwrap.dedent(
    '''
    """Stand-in of bitblas 0.1.0.post1 (tests/bitblas_standin.py): the names the cache uses."""
    import os

    __version__ = os.environ.get("STANDIN_BITBLAS_VERSION", "0.1.0.post1")

    import tvm as tvm  # noqa: E402  (theirs: the bundled 3rdparty/tvm, put on sys.path first)

    from .utils import auto_detect_nvidia_target  # noqa: E402,F401
    from .ops.general_matmul import MatmulConfig, Matmul  # noqa: E402,F401
    from .module import Linear  # noqa: E402,F401
    '''
)

BITBLAS_COMMON_SOURCE = textwrap.dedent(
    '''
    import os

    BITBLAS_DEFAULT_CACHE_PATH = os.path.expanduser("~/.cache/bitblas")
    '''
)

BITBLAS_UTILS_SOURCE = textwrap.dedent(
    '''
    """Stand-in of bitblas.utils: the cache path, and the target detection (no nvidia-smi here)."""
    import os

    from bitblas.common import BITBLAS_DEFAULT_CACHE_PATH


    def get_default_cache_path():
        return BITBLAS_DEFAULT_CACHE_PATH


    def auto_detect_nvidia_target(gpu_id: int = 0) -> str:
        # Theirs matches nvidia-smi's model against TVM's tags: "nvidia/nvidia-h100" on an H100.
        return os.environ.get("STANDIN_BITBLAS_TARGET", "nvidia/nvidia-h100")
    '''
)

OPERATOR_SOURCE = textwrap.dedent(
    '''
    """Stand-in of bitblas.ops.operator: OperatorConfig and the Operator state the cache uses
    (rt_mod, scheduled_ir_module, lib_generator's srcpath/libpath/lib_code, lib, get_source,
    update_runtime_module as theirs), with real builds instead of TVM's schedules."""
    import ctypes
    import itertools
    import json
    import os
    import subprocess
    import tempfile
    import threading
    import time
    import uuid
    from dataclasses import dataclass
    from typing import Optional

    from bitblas import tvm as tvm
    from tvm.target import Target
    from tvm import runtime

    _builds = itertools.count()
    # Tunings run in this process (the rank reports it).
    TUNINGS = []


    @dataclass(frozen=True)
    class OperatorConfig:
        """Base class for operator configurations. Used for typing."""

        pass


    class ScheduledModule:
        """Stands for the scheduled IRModule: the cache writes its script() to optimized.py."""

        def __init__(self, text):
            self.text = text

        def script(self, show_meta=False):
            return self.text


    class LibraryGenerator:
        """As bitblas.builder.lib_generator.LibraryGenerator: the wrapper source is written to a
        NamedTemporaryFile(suffix=".cu") and compiled next to it (cc here, nvcc theirs)."""

        def __init__(self, arch):
            self.arch = arch
            self.lib_code = None
            self.libpath = None
            self.srcpath = None

        def update_lib_code(self, lib_code):
            self.lib_code = lib_code

        def compile_lib(self, timeout=None, with_tl=False):
            src = tempfile.NamedTemporaryFile(mode="w", suffix=".cu", delete=False)
            libpath = src.name.replace(".cu", ".so")
            src.write(self.lib_code)
            src.close()
            subprocess.run(["cc", "-x", "c", "-shared", "-fPIC", "-o", libpath, src.name], check=True,
                           capture_output=True)
            self.srcpath = src.name
            self.libpath = libpath

        def load_lib(self):
            return ctypes.CDLL(self.libpath)

        def get_source_path(self):
            return self.srcpath

        def get_lib_path(self):
            return self.libpath

        def set_lib_path(self, libpath):
            self.libpath = libpath

        def set_src_path(self, srcpath):
            self.srcpath = srcpath


    def _c_string(text):
        return json.dumps(text)  # a JSON string of ASCII text is a valid C string literal


    class Operator(object):

        def __init__(self, name, config, target: Target = None, backend="tir"):
            if isinstance(target, str):
                target = Target(target)
            self.name = name
            self.config = config
            self.target = target
            self.backend = backend

            self.scheduled_ir_module = None
            self.rt_mod = None
            self.time_evaluator = None
            self.dynamic_range = None
            self.arch = target  # theirs: get_arch(target), a TileDevice
            self.pass_context = None
            self.lib_generator = LibraryGenerator(self.arch)
            self.lib: Optional[ctypes.CDLL] = None

        def get_source(self, target: Optional[Target] = None, kenrel_only=False) -> str:
            if target is None:
                target = self.target
            if self.lib_generator.lib_code is not None and not kenrel_only:
                return self.lib_generator.lib_code
            if self.rt_mod is None:
                self._build_runtime_module(target)
            return self.rt_mod.imported_modules[0].get_source() if self.rt_mod else None

        def _build(self, kind):
            """Stands for scheduling, tvm.build and the wrapper's compile (theirs
            _build_runtime_module): a kernel module and a wrapper library, each one new."""
            build_id = f"{kind} pid {os.getpid()} build {next(_builds)} {uuid.uuid4().hex}"
            kernel = (f"// {kind} kernel of {self.name} for {self.target}\\n// {self.config!r}\\n"
                      f"// {build_id}\\n__global__ void {self.name}_kernel() {{}}\\n")
            self.scheduled_ir_module = ScheduledModule(f"# {kind} schedule of {self.name}\\n# {build_id}\\n")
            self.rt_mod = runtime.build_module(kernel, self.name)
            self.time_evaluator = self.rt_mod.time_evaluator(self.rt_mod.entry_name, None, number=10)
            wrapped = (f"/* BitBLAS wrapper of {self.name}: {build_id} */\\n"
                       f"static const char build_id[] = {_c_string(build_id)};\\n"
                       "static int ready;\\n"
                       "int init(void) { ready = 1; return 0; }\\n"
                       "int initialized(void) { return ready; }\\n"
                       "const char *standin_build_id(void) { return build_id; }\\n"
                       "int call(void) { return ready ? 0 : -1; }\\n")
            self.lib_generator.update_lib_code(wrapped)
            self.lib_generator.compile_lib()
            self.lib = self.lib_generator.load_lib()
            self.lib.init()

        def _build_runtime_module(self, target):
            self._build("runtime")

        def _build_default_module(self, target):
            self._build("default")

        def hardware_aware_finetune(self, topk: int = 20, target=None, parallel_build=True):
            marks = os.environ.get("STANDIN_BITBLAS_MARKS")
            if marks:
                with open(os.path.join(marks, f"tune-{os.getpid()}-{len(TUNINGS)}"), "x") as mark:
                    mark.write(repr(self.config))
                try:
                    os.rename(os.path.join(marks, "hang-once"), os.path.join(marks, f"hung-{os.getpid()}"))
                    threading.Event().wait()  # "dies mid-tune": the test SIGKILLs this process
                except FileNotFoundError:
                    pass
                if os.path.exists(os.path.join(marks, "hold")):
                    while not os.path.exists(os.path.join(marks, "release")):
                        time.sleep(0.01)
            TUNINGS.append(repr(self.config))
            self._build("tuned")

        def update_runtime_module(self, rt_mod=None, srcpath=None, libpath=None):
            if rt_mod is not None:
                self.rt_mod = rt_mod
                self.time_evaluator = rt_mod.time_evaluator(
                    rt_mod.entry_name, None, number=10)
                self.torch_func = rt_mod  # theirs: to_pytorch_func(rt_mod)
            if srcpath is not None:
                assert self.lib_generator is not None, "lib_generator is not initialized"
                self.lib_generator.set_src_path(srcpath)
                # TODO(lei): update the lib code from srcpath
            if libpath is not None:
                assert self.lib_generator is not None, "lib_generator is not initialized"
                self.lib_generator.set_lib_path(libpath)
                self.lib = ctypes.CDLL(libpath)
                self.lib.init()

        @property
        def srcpath(self):
            return self.lib_generator.get_source_path()

        @property
        def libpath(self):
            return self.lib_generator.get_lib_path()

        @property
        def wrapped_source(self):
            return self.lib_generator.lib_code
    '''
)

MATMUL_SOURCE = textwrap.dedent(
    '''
    """Stand-in of bitblas.ops.general_matmul: MatmulConfig (a frozen dataclass, M legalized to a
    tuple) and Matmul (default build unless from_database; tuning when enable_tuning)."""
    from dataclasses import dataclass
    from typing import Optional, Tuple, Union

    from bitblas.ops.operator import Operator, OperatorConfig
    from bitblas.utils import auto_detect_nvidia_target


    @dataclass(frozen=True)
    class MatmulConfig(OperatorConfig):
        M: Union[int, Tuple[int]] = None
        N: Optional[int] = None
        K: Optional[int] = None
        A_dtype: str = "float16"
        W_dtype: str = A_dtype
        out_dtype: str = "float16"
        accum_dtype: str = "float16"
        layout: str = "nt"
        with_bias: bool = False
        group_size: int = -1
        with_scaling: bool = False
        with_zeros: bool = False
        zeros_mode: str = "original"
        storage_dtype: str = "int8"
        fast_decoding: Optional[bool] = None
        propagate_a: Optional[int] = None
        propagate_b: Optional[int] = None

        def __post_init__(self):
            object.__setattr__(self, "M", tuple(self.M) if isinstance(self.M, list) else self.M)


    class Matmul(Operator):
        BITBLAS_TRICK_DTYPE_MAP = {"float16": ("fp", 16), "int8": ("int", 8), "int4": ("int", 4)}

        def __init__(self, config, name="matmul", target=None, enable_tuning=True, from_database=False,
                     backend="tl"):
            if target is None:
                target = auto_detect_nvidia_target()
            source_format, bit = self.BITBLAS_TRICK_DTYPE_MAP[config.W_dtype]
            self.source_format = source_format
            self.bit = bit
            super().__init__(name, config, target, backend)
            target = self.target
            if target.kind.name not in ("cuda", "hip"):
                raise ValueError("Currently only support cuda and hip target")
            self.dispatch(target, from_database, source_format, enable_tuning)

        def dispatch(self, target, from_database=False, source_format="uint", enable_tuning=True):
            self.dynamic_range = {"m": self.config.M} if isinstance(self.config.M, tuple) else None
            if not from_database:
                self._build_default_module(target)
            if enable_tuning:
                self.hardware_aware_finetune()
    '''
)

LADDER_SOURCE = textwrap.dedent(
    '''
    """Stand-in of bitblas.ops.ladder_permutate: an operator that Matmul may tune too, and that
    the bitblas package does not export (their loader cannot build it back)."""
    from dataclasses import dataclass

    from bitblas.ops.operator import Operator, OperatorConfig


    @dataclass(frozen=True)
    class LadderPermutateConfig(OperatorConfig):
        M: int = None
        N: int = None


    class LadderPermutate(Operator):
        def __init__(self, config, name="permutate", target=None, enable_tuning=False, from_database=False):
            super().__init__(name, config, target, "tir")
            if not from_database:
                self._build_default_module(target)
                if enable_tuning:
                    self.hardware_aware_finetune()
    '''
)

MODULE_SOURCE = textwrap.dedent(
    '''
    """Stand-in of bitblas.module: Linear without torch; _configure_bitblas_matmul and
    _get_or_create_bitblas_operator are BitBLAS's, line for line."""
    from logging import getLogger

    logger = getLogger(__name__)

    from typing import List, Union, Optional

    from bitblas.cache import global_operator_cache, get_database_path
    from bitblas import Matmul, MatmulConfig
    from bitblas import auto_detect_nvidia_target

    BITBLAS_DATABASE_PATH = get_database_path()


    class Linear:  # theirs: nn.Module
        opt_M = [16, 32, 64, 128, 256, 512]
        STORAGE_DTYPE = "int8"  # assume int8 storage

        def __init__(
            self,
            in_features: int,
            out_features: int,
            bias: bool = False,
            A_dtype: str = "float16",
            W_dtype: str = "float16",
            accum_dtype: str = "float16",
            out_dtype: str = "float16",
            group_size: int = -1,
            with_scaling: bool = None,
            with_zeros: bool = False,
            zeros_mode: str = None,
            opt_M: Union[int, List[int]] = opt_M,
            enable_tuning: bool = True,
            fast_decoding: Optional[bool] = None,
            propagate_b: bool = False,
        ):
            self.in_features = in_features
            self.out_features = out_features
            self.opt_M = opt_M
            self.group_size = self._set_group_size(group_size, in_features)
            self.zeros_mode = zeros_mode
            self._validate_parameters(self.group_size, in_features, out_features)
            self._configure_bitblas_matmul(
                A_dtype,
                W_dtype,
                accum_dtype,
                out_dtype,
                with_scaling,
                with_zeros,
                zeros_mode,
                enable_tuning,
                fast_decoding,
                bias,
                propagate_b,
            )

        def _validate_parameters(self, group_size, in_features, out_features):
            if in_features % 16 != 0 or out_features % 16 != 0:
                raise ValueError("`in_features` and `out_features` must be divisible by 16.")
            if in_features % group_size != 0:
                raise ValueError("`in_features` must be divisible by `group_size`.")

        def _set_group_size(self, group_size, in_features):
            return in_features if (group_size == -1 or group_size is None) else group_size

        def _configure_bitblas_matmul(
            self,
            A_dtype,
            W_dtype,
            accum_dtype,
            out_dtype,
            with_scaling,
            with_zeros,
            zeros_mode,
            enable_tuning,
            fast_decoding,
            bias,
            propagate_b,
        ):
            matmul_config = MatmulConfig(
                M=self.opt_M,
                N=self.out_features,
                K=self.in_features,
                A_dtype=A_dtype,
                W_dtype=W_dtype,
                accum_dtype=accum_dtype,
                out_dtype=out_dtype,
                storage_dtype=self.STORAGE_DTYPE,
                with_scaling=with_scaling,
                with_zeros=with_zeros,
                group_size=self.group_size,
                fast_decoding=fast_decoding,
                with_bias=bias,
                propagate_b=propagate_b,
                zeros_mode=zeros_mode,
            )
            self.bitblas_matmul = self._get_or_create_bitblas_operator(matmul_config, enable_tuning)
            self.bits = self.bitblas_matmul.bit
            self.source_format = self.bitblas_matmul.source_format

        def _get_or_create_bitblas_operator(self, config, enable_tuning):
            BITBLAS_TARGET = auto_detect_nvidia_target()

            if global_operator_cache.size() == 0:
                global_operator_cache.load_from_database(BITBLAS_DATABASE_PATH, BITBLAS_TARGET)
                logger.info(f"Loaded {global_operator_cache.size()} operators from database.")

            bitblas_matmul = global_operator_cache.get(config)
            if bitblas_matmul is None:
                # should disable tuning for the first time because we may require loading bitblas operator from database.
                bitblas_matmul = Matmul(config, target=BITBLAS_TARGET, enable_tuning=False)
                if enable_tuning:
                    bitblas_matmul.hardware_aware_finetune(topk=20)
                    global_operator_cache.add(config, bitblas_matmul)
                    global_operator_cache.save_into_database(BITBLAS_DATABASE_PATH, BITBLAS_TARGET)
                    print("BitBLAS Tuning done, appended operator to global_operator_cache.")
                else:
                    print("BitBLAS Operator created.")
            else:
                print("BitBLAS Operator found in global_operator_cache.")
            return bitblas_matmul


    __all__ = ["Linear"]
    '''
)

TVM_INIT_SOURCE = textwrap.dedent(
    '''
    """Stand-in of the parts of TVM that BitBLAS's cache uses."""
    from . import target, runtime, contrib  # noqa: F401
    '''
)

TVM_TARGET_SOURCE = textwrap.dedent(
    '''
    """Stand-in of tvm.target.Target: a tag or "cuda [-arch=sm_XX]"; keys and arch as TVM gives
    them (the tag itself is not kept, as in TVM: str(target) is the expanded form)."""
    TAGS = {"nvidia/nvidia-h100": "sm_90a", "nvidia/nvidia-a100": "sm_80", "nvidia/geforce-rtx-4090": "sm_89"}


    class _Kind:
        def __init__(self, name):
            self.name = name


    class Target:
        def __init__(self, target):
            text = str(target).strip()
            if text in TAGS:
                kind, arch = "cuda", TAGS[text]
            else:
                words = text.split()
                kind = words[0]
                arch = next((w.split("=", 1)[1] for w in words[1:] if w.startswith("-arch=")), "sm_50")
            self.kind = _Kind(kind)
            self.keys = ["cuda", "gpu"] if kind == "cuda" else [kind]
            self.arch = arch

        def __str__(self):
            return f"{self.kind.name} -keys={','.join(self.keys)} -arch={self.arch}"

        __repr__ = __str__
    '''
)

TVM_RUNTIME_SOURCE = textwrap.dedent(
    '''
    """Stand-in of tvm.runtime: a built Module (its object file holds the kernel's source),
    export_library(path, fcompile) and load_module(path) as TVM's: a .tar is unpacked into a
    directory next to it (os.mkdir: it must not exist), linked into <path>.so and dlopened."""
    import ctypes
    import json
    import os
    import subprocess

    from tvm.contrib import cc as _cc, tar as _tar, utils as _utils


    class _SourceModule:
        def __init__(self, source):
            self._source = source

        def get_source(self, fmt=""):
            return self._source


    class Module:
        def __init__(self, source, entry_name, objects=None, lib=None):
            self.entry_name = entry_name
            self.imported_modules = [_SourceModule(source)]
            self._objects = objects
            self._lib = lib

        def time_evaluator(self, func_name, dev, number=10, **kwargs):
            return lambda *args: None

        def export_library(self, file_name, fcompile=None, **kwargs):
            if self._objects is None:
                raise RuntimeError("Module[library] cannot be exported")
            temp = _utils.tempdir()
            files = []
            for name, data in self._objects.items():
                path = temp.relpath(name)
                with open(path, "wb") as f:
                    f.write(data)
                files.append(path)
            fcompile(file_name, files)


    def build_module(kernel_source, entry_name):
        """Stands for tvm.build: an object file whose tvm_standin_source() answers the kernel."""
        temp = _utils.tempdir()
        source = temp.relpath("lib0.c")
        with open(source, "w") as f:
            f.write("const char *tvm_standin_source(void) { return " + json.dumps(kernel_source) + "; }\\n")
            f.write("int " + entry_name + "(void) { return 0; }\\n")
        subprocess.run(["cc", "-c", "-fPIC", "-o", temp.relpath("lib0.o"), source], check=True, capture_output=True)
        with open(temp.relpath("lib0.o"), "rb") as f:
            objects = {"lib0.o": f.read()}
        return Module(kernel_source, entry_name, objects=objects)


    def load_module(path, fmt=""):
        if os.path.isfile(path):
            path = os.path.realpath(path)
        else:
            raise ValueError(f"cannot find file {path}")
        if path.endswith(".tar"):
            tar_temp = _utils.tempdir(custom_path=path.replace(".tar", ""))
            _tar.untar(path, tar_temp.temp_dir)
            files = [tar_temp.relpath(x) for x in tar_temp.listdir()]
            _cc.create_shared(path + ".so", files)
            path += ".so"
        lib = ctypes.CDLL(path)
        lib.tvm_standin_source.restype = ctypes.c_char_p
        return Module(lib.tvm_standin_source().decode(), "main", lib=lib)
    '''
)

TVM_CONTRIB_INIT_SOURCE = ""

TVM_UTILS_SOURCE = textwrap.dedent(
    '''
    """Stand-in of tvm.contrib.utils.tempdir: a custom_path is os.mkdir'ed, as TVM's is; the
    directory is removed when the object goes."""
    import os
    import shutil
    import tempfile


    class TempDirectory:
        def __init__(self, custom_path=None):
            if custom_path:
                os.mkdir(custom_path)
                self.temp_dir = custom_path
            else:
                self.temp_dir = tempfile.mkdtemp()

        def remove(self):
            if self.temp_dir:
                shutil.rmtree(self.temp_dir, ignore_errors=True)
                self.temp_dir = None

        def __del__(self):
            self.remove()

        def relpath(self, name):
            return os.path.join(self.temp_dir, name)

        def listdir(self):
            return os.listdir(self.temp_dir)


    def tempdir(custom_path=None):
        return TempDirectory(custom_path)
    '''
)

TVM_TAR_SOURCE = textwrap.dedent(
    '''
    """tvm.contrib.tar as TVM's: tar -czf of the files' copies, untar with tar -xf."""
    import os
    import shutil
    import subprocess

    from . import utils


    def tar(output, files):
        cmd = ["tar"]
        cmd += ["-czf"]
        temp = utils.tempdir()
        fset = set()
        for fname in files:
            base = os.path.basename(fname)
            if base in fset:
                raise ValueError(f"duplicate file name {base}")
            fset.add(base)
            shutil.copy(fname, temp.relpath(base))
        cmd += [output]
        cmd += ["-C", temp.temp_dir]
        cmd += temp.listdir()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        (out, _) = proc.communicate()
        if proc.returncode != 0:
            raise RuntimeError("Tar error:\\n" + out.decode())


    tar.output_format = "tar"


    def untar(tar_file, directory):
        cmd = ["tar", "-xf", tar_file, "-C", directory]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        (out, _) = proc.communicate()
        if proc.returncode != 0:
            raise RuntimeError("Tar error:\\n" + out.decode())
    '''
)

TVM_CC_SOURCE = textwrap.dedent(
    '''
    import subprocess


    def create_shared(output, objects, options=None, cc=None, cwd=None, ccache_env=None):
        subprocess.run([cc or "cc", "-shared", "-fPIC", "-o", output, *objects, *(options or [])], check=True,
                       capture_output=True, cwd=cwd)
    '''
)

TVM_NVCC_SOURCE = textwrap.dedent(
    '''
    import os


    def get_cuda_version(cuda_path=None):
        # Theirs reads <cuda>/version.txt or `nvcc --version`: a tuple of ints.
        return tuple(int(part) for part in os.environ.get("STANDIN_CUDA_VERSION", "12.4.131").split("."))
    '''
)

FILES = {
    "bitblas/__init__.py": BITBLAS_INIT_SOURCE,
    "bitblas/common.py": BITBLAS_COMMON_SOURCE,
    "bitblas/utils/__init__.py": BITBLAS_UTILS_SOURCE,
    "bitblas/cache/__init__.py": CACHE_INIT_SOURCE,
    "bitblas/cache/operator.py": CACHE_OPERATOR_SOURCE,
    "bitblas/ops/__init__.py": "",
    "bitblas/ops/operator.py": OPERATOR_SOURCE,
    "bitblas/ops/general_matmul.py": MATMUL_SOURCE,
    "bitblas/ops/ladder_permutate.py": LADDER_SOURCE,
    "bitblas/module/__init__.py": MODULE_SOURCE,
    "tvm/__init__.py": TVM_INIT_SOURCE,
    "tvm/target.py": TVM_TARGET_SOURCE,
    "tvm/runtime.py": TVM_RUNTIME_SOURCE,
    "tvm/contrib/__init__.py": TVM_CONTRIB_INIT_SOURCE,
    "tvm/contrib/utils.py": TVM_UTILS_SOURCE,
    "tvm/contrib/tar.py": TVM_TAR_SOURCE,
    "tvm/contrib/cc.py": TVM_CC_SOURCE,
    "tvm/contrib/nvcc.py": TVM_NVCC_SOURCE,
}


def write_standin(directory: Path) -> Path:
    """Writes the `bitblas` and `tvm` stand-ins under ``directory`` (for PYTHONPATH)."""
    for relative, source in FILES.items():
        path = directory / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source.lstrip("\n"))
    return directory
