# Owns the build steps that pyproject.toml cannot express: generating the gRPC stubs into
# tunecache/v1/ before setuptools collects the package's modules, so a built wheel ships them,
# and requiring at run time a grpcio/protobuf at least as new as the ones that generated them
# (the stubs check this when imported).
import os
import sys
from importlib import metadata

from setuptools import setup
from setuptools.command.build_py import build_py

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_stubs  # noqa: E402  (lives next to this file)


class BuildPyWithStubs(build_py):
    def run(self):
        # Regenerate whenever proto/ is at hand, so the stubs match this build's grpcio-tools;
        # a source tree without proto/ (an sdist) must carry stubs generated earlier.
        if (gen_stubs.DEFAULT_PROTO_ROOT / gen_stubs.CONTRACT_PROTO).is_file():
            gen_stubs.generate()
        elif not gen_stubs.stubs_present():
            raise SystemExit(
                "tunecache: no proto/ directory and no generated stubs; build from the repository"
            )
        super().run()


def runtime_requirements():
    """grpcio >= the grpcio-tools generating the stubs, protobuf of the same major version and
    at least the one it generated for."""
    try:
        tools = metadata.version("grpcio-tools")
        protobuf = metadata.version("protobuf")
    except metadata.PackageNotFoundError:
        return ["grpcio", "protobuf", "googleapis-common-protos"]
    major = int(protobuf.split(".")[0])
    # googleapis-common-protos: google.rpc.Status and BadRequest, the error details the daemon
    # sends with INVALID_ARGUMENT (which entry of a batch it refused).
    return [f"grpcio>={tools}", f"protobuf>={protobuf},<{major + 1}", "googleapis-common-protos"]


setup(cmdclass={"build_py": BuildPyWithStubs}, install_requires=runtime_requirements())
