"""Shared helpers: seeded inputs, the float64 oracle and named comparisons."""

from __future__ import annotations

import pytest
import torch

from attnres_ge import block_attention_residuals_reference
from attnres_ge.op_kernel.reference import max_violation

DTYPE_IDS = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}
WEIGHT_GRADS = ("grad_proj_weight", "grad_norm_weight")


def make_inputs(tokens, blocks, hidden, dtype=torch.float32, seed=0, proj_shape=None):
    """(partial_block [T, H], block_res [T, N, H], proj_weight [1, H], norm_weight [H]) in `dtype`."""
    generator = torch.Generator().manual_seed(seed)
    partial = torch.randn(tokens, hidden, generator=generator)
    blocks_t = torch.randn(tokens, blocks, hidden, generator=generator)
    proj = 0.5 * torch.randn(*(proj_shape or (1, hidden)), generator=generator) / max(hidden, 1) ** 0.5
    norm = 1 + 0.2 * torch.randn(hidden, generator=generator)
    return tuple(t.to(dtype) for t in (partial, blocks_t, proj, norm))


def reference_with_grads(inputs, grad_hidden, norm_eps=1e-6):
    """Float64 reference outputs and autograd gradients of the four inputs (from their rounded values)."""
    leaves = [t.detach().double().requires_grad_() for t in inputs]
    hidden, inv_norm, probs = block_attention_residuals_reference(*leaves, norm_eps=norm_eps)
    hidden.backward(grad_hidden.double())
    return {
        "hidden_states": hidden.detach(),
        "inv_norm": inv_norm.detach(),
        "probs": probs.detach(),
        "grad_partial_block": leaves[0].grad,
        "grad_block_res": leaves[1].grad,
        "grad_proj_weight": leaves[2].grad,
        "grad_norm_weight": leaves[3].grad,
    }


def assert_close_to_reference(name, actual, expected, dtype):
    """Within SPEC.md's tolerance for `dtype` (float32 statistics always at float32 tolerance)."""
    error, past = max_violation(actual, expected, dtype, whole_tensor=name in WEIGHT_GRADS)
    assert past <= 0, f"{name} ({dtype}) drifted from the float64 reference: max |err| {error:.3e}, over by {past:.3e}"


def assert_bitwise_equal(name, actual, expected):
    assert actual.dtype == expected.dtype and actual.shape == expected.shape, (
        f"{name}: {actual.dtype}{list(actual.shape)} vs {expected.dtype}{list(expected.shape)}"
    )
    same = torch.equal(actual.view(torch.uint8) if actual.numel() else actual, expected.view(torch.uint8)
                       if expected.numel() else expected)
    assert same, f"{name} differs bitwise"


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
