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
import time

from setuptools import setup

NATIVE_MODULE = "attnres_ge.op_kernel._native"
SOURCES = [
    "op_kernel/csrc/native_module.cpp",
    "op_kernel/csrc/dispatch.cpp",
    "op_kernel/csrc/thread_pool.cpp",
    "op_kernel/csrc/openmp_release.cpp",
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


def _say(message: str) -> None:
    print(f"attnres-ge setup: {message}", file=sys.stderr, flush=True)


def _native_build():
    """(ext_modules, cmdclass) for the native extensions, or ([], {}) when they cannot be built."""
    if os.environ.get(SKIP_ENV, "0") not in ("", "0"):
        _say(f"{SKIP_ENV} is set: skipping the native extensions; the Python kernels will be used")
        return [], {}
    try:
        from torch.utils.cpp_extension import BuildExtension, CppExtension
    except Exception as error:  # torch missing or broken: not fatal
        _say(
            f"torch is not importable at build time ({error!r}): skipping the native extensions; the Python "
            "kernels will be used. To build them: pip install torch==2.13.0, then "
            "pip install --no-build-isolation -e ."
        )
        return [], {}

    class OptionalBuildExtension(BuildExtension):
        """BuildExtension that reports and skips a failed native build instead of failing the install."""

        failed: set[str] = set()

        def build_extensions(self):
            super().build_extensions()
            # Later steps (copying into the source tree, listing outputs) see only what was built.
            self.extensions = [ext for ext in self.extensions if ext.name not in self.failed]

        def build_extension(self, ext):
            started = time.perf_counter()
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
setup(ext_modules=ext_modules, cmdclass=cmdclass)
