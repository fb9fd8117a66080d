# Owns the stand-in of Triton's active driver for the Triton cache-manager tests: the machine has
# no GPU, so this object answers what Triton asks the driver for (the current target, device and
# stream, device properties, loading a compiled binary, a launcher, the benchmarker) without a
# GPU. Everything else, the compiler pipeline down to ptxas, the Autotuner and the cache code,
# is the installed triton package's own. The benchmarker runs Triton's kernel call (so the kernel
# is compiled and "launched" through this driver) and reports fixed timings by call order.
from __future__ import annotations

from triton.backends.compiler import GPUTarget
from triton.backends.driver import DriverBase
from triton.runtime import driver as runtime_driver

# An H100/H200-like device: sm_90, 32-wide warps.
TARGET = GPUTarget("cuda", 90, 32)
PROPERTIES = {
    "max_shared_mem": 232448,
    "max_num_regs": 65536,
    "multiprocessor_count": 132,
    "warpSize": 32,
    "sm_clock_rate": 1980000,
    "mem_clock_rate": 2619000,
    "mem_bus_width": 5120,
}


class _Utils:
    def get_device_properties(self, device):
        return dict(PROPERTIES)

    def load_binary(self, name, kernel, shared, device):
        # (module, function, n_regs, n_spills, n_max_threads) as cuModuleLoadData would give.
        return (1, 1, 32, 0, 1024)

    def unload_module(self, module):
        pass


class StandinDriver(DriverBase):
    def __init__(self, benchmarker):
        super().__init__()
        self.utils = _Utils()
        self._benchmarker = benchmarker
        self.launches = 0

    @classmethod
    def is_active(cls):
        return False  # never picked by Triton itself; installed with set_active

    def map_python_to_cpp_type(self, ty):
        return ty

    def get_current_target(self):
        return TARGET

    def get_active_torch_device(self):
        raise RuntimeError("the stand-in driver has no torch device")

    def get_current_device(self):
        return 0

    def set_current_device(self, device):
        pass

    def get_current_stream(self, device=None):
        return 0

    def get_benchmarker(self):
        return self._benchmarker

    def launcher_cls(self, src, metadata):
        def launch(*args):
            self.launches += 1

        return launch


def install(benchmarker):
    """Makes the stand-in Triton's active driver."""
    standin = StandinDriver(benchmarker)
    runtime_driver.set_active(standin)
    return standin
