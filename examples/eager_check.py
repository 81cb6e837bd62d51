"""Eager demo: one Block AttnRes layer forward and backward, checked against the float64 reference.

Run: attnres-ge demo   (or python -m attnres_ge.examples.eager_check)
"""

from __future__ import annotations

import torch

from attnres_ge import BlockAttnRes, block_attention_residuals_reference
from attnres_ge.op_kernel.reference import TOLERANCES, max_violation

TOKENS, BLOCKS, HIDDEN = 256, 4, 512


def _layer_inputs(dtype: torch.dtype, generator: torch.Generator):
    layer = BlockAttnRes(HIDDEN, dtype=dtype)
    with torch.no_grad():
        layer.proj_weight.copy_(torch.randn(1, HIDDEN, generator=generator) * 0.05)
        layer.norm_weight.copy_(1 + 0.1 * torch.randn(HIDDEN, generator=generator))
    partial = torch.randn(TOKENS, HIDDEN, generator=generator).to(dtype).requires_grad_()
    blocks = torch.randn(TOKENS, BLOCKS, HIDDEN, generator=generator).to(dtype).requires_grad_()
    return layer, partial, blocks


def check_dtype(dtype: torch.dtype, generator: torch.Generator) -> bool:
    """Forward and backward of one layer against the float64 reference; prints one line per tensor."""
    layer, partial, blocks = _layer_inputs(dtype, generator)
    hidden = layer(partial, blocks)
    grad_out = torch.randn(TOKENS, HIDDEN, generator=generator).to(dtype)
    hidden.backward(grad_out)

    leaves = [t.detach().double().requires_grad_() for t in (partial, blocks, layer.proj_weight, layer.norm_weight)]
    ref_hidden, _, _ = block_attention_residuals_reference(*leaves, norm_eps=layer.norm_eps)
    ref_hidden.backward(grad_out.double())

    checks = [("hidden_states", hidden, ref_hidden, False)]
    grads = (partial.grad, blocks.grad, layer.proj_weight.grad, layer.norm_weight.grad)
    names = ("grad_partial_block", "grad_block_res", "grad_proj_weight", "grad_norm_weight")
    for name, grad, leaf in zip(names, grads, leaves, strict=True):
        checks.append((name, grad, leaf.grad, name in ("grad_proj_weight", "grad_norm_weight")))
    ok = True
    rtol, atol = TOLERANCES[dtype]
    for name, actual, expected, whole in checks:
        error, past = max_violation(actual, expected, dtype, whole_tensor=whole)
        ok &= past <= 0
        # Weight gradients sum over every token and row; their tolerance is relative to the largest entry.
        scale = f" of max|ref| {expected.abs().max().item():.3e}" if whole else ""
        print(f"  {str(dtype):<15} {name:<20} max|err| {error:.3e}{scale}  (rtol {rtol:g}, atol {atol:g})  "
              f"{'ok' if past <= 0 else 'FAIL'}")
    return ok


def main() -> int:
    generator = torch.Generator().manual_seed(0)
    print(f"Block AttnRes, one layer, eager: T={TOKENS} N={BLOCKS} H={HIDDEN}, against a float64 reference")
    ok = all([check_dtype(dtype, generator) for dtype in TOLERANCES])
    print("all within the tolerances of docs/contract.md" if ok else "SOME CHECKS FAILED")
    # The kernels' tiling of this shape is attnres-ge tiling's to show, not the demo's.
    print(f"how the kernels split this shape: attnres-ge tiling --op forward --shape {TOKENS},{BLOCKS},{HIDDEN}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
