"""Builds the C kernels at install: `pip install .` compiles them into the installed package, `pip install -e .`
(make setup) into the checkout's inference/engine/kernels/_built/. A kernel that does not build (no compiler) does
not fail the install: the worker says which kernel is missing, on /info and /metrics, and runs torch's path for it.
Everything else about the project is in pyproject.toml."""
import importlib.util
from pathlib import Path

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

KERNELS = Path(__file__).resolve().parent / "inference" / "engine" / "kernels"


def _kernel_builder():
    # By path: the kernel builder imports only the standard library, and the project's packages may not import here.
    spec = importlib.util.spec_from_file_location("tandem_kernel_build", KERNELS / "build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class BuildPyWithKernels(build_py):
    def run(self):
        super().run()
        builder = _kernel_builder()
        target = KERNELS / "_built" if self.editable_mode else \
            Path(self.build_lib) / "inference" / "engine" / "kernels" / "_built"
        for name, error in builder.build_all(target).items():
            print(f"tandem kernel {name}: {'built into ' + str(target) if error is None else 'NOT BUILT: ' + error}")


class WithKernels(Distribution):
    """Not pure Python: the wheel carries shared libraries, so it is tagged for this platform and Python."""

    def has_ext_modules(self):
        return True


setup(cmdclass={"build_py": BuildPyWithKernels}, distclass=WithKernels)
