# Owns one build step that pyproject.toml cannot express: generating the gRPC stubs into
# tunecache/v1/ before setuptools collects the package's modules, so a built wheel ships them.
import os
import sys

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


setup(cmdclass={"build_py": BuildPyWithStubs})
