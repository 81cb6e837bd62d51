"""torch.library.opcheck: schema, fake kernel, autograd registration and dispatch consistency."""

from __future__ import annotations

import pytest
import torch
from conftest import make_inputs

import attnres_ge

forward_op = torch.ops.attnres.block_attention_residuals
backward_op = torch.ops.attnres.block_attention_residuals_backward

CASES = [
    pytest.param(8, 3, 16, torch.float32, id="T8-N3-H16-fp32"),
    pytest.param(0, 2, 8, torch.float32, id="T0-N2-H8-fp32"),
    pytest.param(5, 1, 33, torch.float16, id="T5-N1-H33-fp16"),
    pytest.param(17, 4, 24, torch.bfloat16, id="T17-N4-H24-bf16"),
]


def strided(tensor: torch.Tensor) -> torch.Tensor:
    """The same values in a transposed, non-contiguous layout."""
    return tensor.t().contiguous().t() if tensor.dim() == 2 else tensor


@pytest.mark.parametrize(("tokens", "blocks", "hidden", "dtype"), CASES)
@pytest.mark.parametrize("need_backward", [True, False], ids=["saved", "not-saved"])
def test_forward_opcheck(tokens, blocks, hidden, dtype, need_backward):
    partial, blocks_t, proj, norm = make_inputs(tokens, blocks, hidden, dtype)
    partial.requires_grad_(need_backward)
    torch.library.opcheck(forward_op, (partial, blocks_t, proj, norm, -1, 1e-6, need_backward))


@pytest.mark.parametrize(("tokens", "blocks", "hidden", "dtype"), CASES)
def test_forward_opcheck_non_contiguous_and_offset(tokens, blocks, hidden, dtype):
    partial, blocks_t, proj, norm = make_inputs(tokens, blocks, hidden, dtype)
    offset_norm = torch.cat([torch.zeros(1, dtype=dtype), norm])[1:]
    torch.library.opcheck(forward_op, (strided(partial), blocks_t, proj, offset_norm, -1, 1e-6, True))


@pytest.mark.parametrize(("tokens", "blocks", "hidden", "dtype"), CASES)
def test_backward_opcheck(tokens, blocks, hidden, dtype):
    inputs = make_inputs(tokens, blocks, hidden, dtype)
    _, inv_norm, probs = forward_op(*inputs, -1, 1e-6, True)
    grad_hidden = strided(torch.randn(tokens, hidden).to(dtype))
    torch.library.opcheck(backward_op, (*inputs, grad_hidden, inv_norm, probs), {"valid_block_num": 0})


@pytest.mark.slow
def test_torch_compile_with_inductor_forward_and_backward():
    """The fake kernels are enough for inductor (fullgraph): results equal eager bit for bit."""
    layer = attnres_ge.BlockAttnRes(48)
    with torch.no_grad():
        layer.proj_weight.normal_(0, 0.1)

    def step(partial, blocks):
        return layer(torch.tanh(partial), blocks).square().sum()

    inputs = make_inputs(10, 3, 48)[:2]
    eager_leaves = [t.clone().requires_grad_() for t in inputs]
    step(*eager_leaves).backward()
    eager_grads = [t.grad for t in eager_leaves] + [layer.proj_weight.grad.clone()]
    layer.zero_grad()
    compiled_leaves = [t.clone().requires_grad_() for t in inputs]
    torch.compile(step, fullgraph=True)(*compiled_leaves).backward()
    compiled_grads = [t.grad for t in compiled_leaves] + [layer.proj_weight.grad]
    for eager, compiled in zip(eager_grads, compiled_grads, strict=True):
        torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-6)
