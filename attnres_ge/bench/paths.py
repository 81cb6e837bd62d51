"""What runs the kernels a run times: the native kernels' instruction set path (--paths), or the Python ones."""

from __future__ import annotations

import torch

ALL_PATHS = "all"


def kernel_path() -> str:
    """What runs the kernels now: the native kernels' instruction set path, or "python"."""
    from attnres_ge.op_kernel import active_implementation

    if active_implementation() != "native":
        return "python"
    from attnres_ge.op_kernel import native  # importable only where the native kernels were built

    return native.isa_path()


def op_path(*kernels) -> str:
    """What runs these ops' kernels: "python" while any of them has no native kernel, else kernel_path()."""
    if not all(kernel.has_native for kernel in kernels):
        return "python"
    return kernel_path()


def two_phase_path() -> str:
    """What runs the two-phase kernels: "python" while either op has no native kernel, else kernel_path()."""
    from attnres_ge.op_kernel.block_attn_res_prepare import KERNEL as PREPARE_KERNEL
    from attnres_ge.op_kernel.block_attn_res_update import KERNEL as UPDATE_KERNEL

    return op_path(PREPARE_KERNEL, UPDATE_KERNEL)


def paths_to_time(names: list[str] | None) -> list[str]:
    """--paths as a list of the native kernels' paths (ALL_PATHS: every one this CPU runs); [] for the path
    the kernels run on now. ValueError naming what this CPU runs when a path cannot be timed."""
    if not names:
        return []
    from attnres_ge.op_kernel import active_implementation

    if active_implementation() != "native":
        raise ValueError("--paths needs the native kernels; the kernels running now are the Python ones")
    from attnres_ge.op_kernel import native

    available = list(native.available_isa_paths())
    if ALL_PATHS in names:
        return available
    unknown = [name for name in names if name not in available]
    if unknown:
        raise ValueError(f"--paths: this CPU cannot run {', '.join(unknown)}; it runs {', '.join(available)}")
    return list(dict.fromkeys(names))


def on_path(path: str | None, run):
    """run() with the native kernels on `path`, then back on the path they ran on before; None: run() on the
    kernels as they run now."""
    if path is None:
        return run()
    from attnres_ge.op_kernel import native

    before = native.isa_path()
    native.use_isa_path(path)
    try:
        return run()
    finally:
        native.use_isa_path(before)


def kernel_threads() -> int:
    """Threads a large call of the kernels runs on: the host's usable cores, at most torch.get_num_threads()."""
    from attnres_ge.op_host.platform import host_profile

    return min(host_profile().vector_core_num, torch.get_num_threads())
