"""Python kernel of the toy op ScaledAdd (the oracle of its native kernel, csrc/scaled_add_kernel.h), and its
inputs for the benchmark."""

from __future__ import annotations

import torch

from attnres_ge.op_host.scaled_add_tiling import TILING
from attnres_ge.op_kernel.kernel_spec import OpKernel


def scaled_add_kernel(x, y, z, workspace, tiling_data):
    torch.add(x, y, alpha=tiling_data.alpha, out=z)


def bench_inputs(dims: dict[str, int], dtype: torch.dtype):
    shape = (dims["T"], dims["H"])
    return (torch.randn(shape), torch.randn(shape)), {"alpha": 0.5}


KERNEL = OpKernel(TILING, scaled_add_kernel)
