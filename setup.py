"""Build of the native extensions; the metadata is in pyproject.toml.

  attnres_ge.op_kernel._native    the CPU kernels, compiled for any x86-64 CPU plus AVX2 and
                                  AVX-512 versions chosen at run time (docs/kernels.md)
  attnres_ge.ge_plugin._cpp_entry the ops' C++ entry: eager calls and graph nodes (needs _native)

Both build through torch.utils.cpp_extension, so torch must be importable at build time:

    pip install torch==2.13.0
    pip install --no-build-isolation -e .

It needs no downloads. When torch is not importable, or the compiler fails, the
install goes on without the extension(s): without _native the ops run the Python
kernels (with one warning at first use), without _cpp_entry the ops' Python entry runs
every call; rebuild later with the same pip command.
"""

from __future__ import annotations

import glob
import os
import sys
import threading
import time

from setuptools import setup

NATIVE_MODULE = "attnres_ge.op_kernel._native"
SOURCES = [
    "op_kernel/csrc/native_module.cpp",
    "op_kernel/csrc/dispatch.cpp",
    "op_kernel/csrc/thread_pool.cpp",
    "op_kernel/csrc/openmp_team.cpp",
    # The kernels once per instruction set; each file sets its own target (isa_common.h).
    "op_kernel/csrc/isa_scalar.cpp",
    "op_kernel/csrc/isa_avx2.cpp",
    "op_kernel/csrc/isa_avx512.cpp",
    "op_kernel/csrc/isa_avx512bf16.cpp",
]
HEADERS = sorted(glob.glob("op_kernel/csrc/*.h"))  # rebuilt when one changes; shipped in an sdist
# The ops' C++ entry (dispatcher kernels, compiled graph nodes, launches cached per signature): torch
# headers, so it takes longer to build; it runs the launch records _native hands out in capsules.
ENTRY_MODULE = "attnres_ge.ge_plugin._cpp_entry"
ENTRY_SOURCES = ["ge_plugin/csrc/cpp_entry.cpp"]
ENTRY_HEADERS = sorted(glob.glob("ge_plugin/csrc/*.h"))
WITHOUT = {  # what a failed build of each extension means
    NATIVE_MODULE: "the Python kernels will be used",
    ENTRY_MODULE: "the ops' Python entry will run every call",
}
CXX_FLAGS = [
    "-O3",  # no -march: the baseline runs on any CPU of the architecture; the vector paths set their own targets
    "-pthread",
    "-ffp-contract=off",  # only the kernels' explicit fused multiply-adds: fixed rounding
]
SKIP_ENV = "ATTNRES_GE_NO_NATIVE"  # set to 1 to install without the native extensions


HERE = os.path.dirname(os.path.abspath(__file__))
BUILD_BASE = None  # build/torch-<version>-py<XY>: one build folder per torch and Python (set in _native_build)


def _say(message: str) -> None:
    print(f"attnres-ge setup: {message}", file=sys.stderr, flush=True)


def _native_build():
    """(ext_modules, cmdclass) for the native extensions, or ([], {}) when they cannot be built."""
    if os.environ.get(SKIP_ENV, "0") not in ("", "0"):
        _say(f"{SKIP_ENV} is set: skipping the native extensions; the Python kernels will be used")
        return [], {}
    global BUILD_BASE
    try:
        import torch
        from torch.utils.cpp_extension import BuildExtension, CppExtension
    except Exception as error:  # torch missing or broken: not fatal
        _say(
            f"torch is not importable at build time ({error!r}): skipping the native extensions; the Python "
            "kernels will be used. To build them: pip install torch==2.13.0, then "
            "pip install --no-build-isolation -e ."
        )
        return [], {}

    tag = f"torch-{torch.__version__.replace('+', '-')}-py{sys.version_info[0]}{sys.version_info[1]}"
    BUILD_BASE = os.path.join(HERE, "build", tag)

    class OptionalBuildExtension(BuildExtension):
        """BuildExtension that reports and skips a failed native build instead of failing the install."""

        failed: set[str] = set()
        _thread = threading.local()

        # The extensions build side by side on threads (`parallel`), each in its own object folder (its own
        # build.ninja): distutils reads self.build_temp while building one, so its value is per thread.
        @property
        def build_temp(self):
            return getattr(self._thread, "build_temp", None) or self.__dict__.get("_build_temp")

        @build_temp.setter
        def build_temp(self, value):
            self.__dict__["_build_temp"] = value

        def finalize_options(self):
            super().finalize_options()
            # One object folder per torch and Python, kept between builds (an editable install would otherwise
            # compile in a fresh temporary folder every time): ninja recompiles only what changed, and an
            # editable install and a wheel built against the same torch share the objects.
            self.build_temp = os.path.join(BUILD_BASE, "temp")
            self.parallel = self.parallel or len(self.extensions)

        def build_extensions(self):
            super().build_extensions()
            # Later steps (copying into the source tree, listing outputs) see only what was built.
            self.extensions = [ext for ext in self.extensions if ext.name not in self.failed]

        def build_extension(self, ext):
            started = time.perf_counter()
            self._thread.build_temp = os.path.join(self.__dict__["_build_temp"], ext.name)
            try:
                super().build_extension(ext)
            except Exception as error:  # compiler missing, unsupported flag, ...
                self.failed.add(ext.name)
                _say(
                    f"building {ext.name} failed ({error}); installing without it: {WITHOUT[ext.name]}. "
                    "Fix the compiler and rerun pip install --no-build-isolation -e ."
                )
            else:
                _say(f"built {ext.name} in {time.perf_counter() - started:.1f} s")
            finally:
                self._thread.build_temp = None

    kernels = CppExtension(
        NATIVE_MODULE,
        SOURCES,
        depends=HEADERS,
        extra_compile_args={"cxx": CXX_FLAGS},
        extra_link_args=["-pthread"],
    )
    entry = CppExtension(
        ENTRY_MODULE,
        ENTRY_SOURCES,
        depends=HEADERS + ENTRY_HEADERS,
        extra_compile_args={"cxx": ["-O2"]},
    )
    return [kernels, entry], {"build_ext": OptionalBuildExtension}


ext_modules, cmdclass = _native_build()
# Wheels of different torch versions built from one checkout never share a build folder (build_lib).
options = {"build": {"build_base": BUILD_BASE}} if BUILD_BASE else {}
setup(ext_modules=ext_modules, cmdclass=cmdclass, options=options)
