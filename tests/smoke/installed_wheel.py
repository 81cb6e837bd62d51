"""Smoke test of an installed wheel, run by `make test-wheel` from outside and from inside the clone
(`python - < tests/smoke/installed_wheel.py`, so that the current directory is first on sys.path).

It checks that `import attnres_ge` gives the installed package, not the clone's folders, with its native
kernels, and that a small forward and backward match the float64 reference.
"""

import os
import sys
import sysconfig
from pathlib import Path

import torch

import attnres_ge
from attnres_ge import op_kernel
from attnres_ge.op_kernel.reference import max_violation

site_packages = Path(sysconfig.get_paths()["purelib"]).resolve()
package = Path(attnres_ge.__file__).resolve().parent
assert package.parent == site_packages, f"imported {package}, not the wheel installed in {site_packages}"
assert Path(op_kernel.__file__).resolve().parent == package / "op_kernel", op_kernel.__file__
assert op_kernel.native_available(), f"native kernels missing: {op_kernel.NATIVE_UNAVAILABLE_REASON}"

generator = torch.Generator().manual_seed(0)
partial = torch.randn(12, 64, generator=generator, requires_grad=True)
blocks = torch.randn(12, 3, 64, generator=generator, requires_grad=True)
layer = attnres_ge.BlockAttnRes(hidden_size=64)
hidden = layer(partial, blocks)
hidden.square().sum().backward()

leaves = [t.detach().double().requires_grad_() for t in (partial, blocks, layer.proj_weight, layer.norm_weight)]
expected, _, _ = attnres_ge.block_attention_residuals_reference(*leaves)
expected.square().sum().backward()
for name, actual, reference in (("hidden_states", hidden, expected), ("grad_block_res", blocks.grad, leaves[1].grad)):
    error, past = max_violation(actual.detach(), reference.detach(), torch.float32)
    assert past <= 0, f"{name}: max |err| {error:.3e} over the float32 tolerance"
print(f"installed wheel ok from {os.getcwd()}: {package} (Python {sys.version.split()[0]}, torch {torch.__version__})")
