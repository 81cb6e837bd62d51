"""Second-order gradients: the backward op is differentiable, so gradient penalties, Hessian-vector products
and gradgradcheck are right (against the float64 reference), with either kernel; under torch.compile,
where AOTAutograd refuses double backward, torch's error, never zeros.

The ops accept no float64, so gradcheck/gradgradcheck run in float32: a central difference with step
1e-3 has a truncation error ~1e-6 and a float32 rounding error ~1e-7 * |f| / 1e-3 = 1e-4 |f|, so they
compare with atol = rtol = 1e-2 on O(1) values (a wrong or zero second derivative is off by O(1)).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch
from conftest import assert_bitwise_equal, make_inputs

import attnres_ge
from attnres_ge import block_attention_residuals_reference, op_kernel
from attnres_ge.op_kernel.reference import max_violation

NAMES = ("partial_block", "block_res", "proj_weight", "norm_weight")
GRADCHECK = {"eps": 1e-3, "atol": 1e-2, "rtol": 1e-2}


@pytest.fixture(params=["native", "python"])
def kernel(request):
    if request.param == "native" and not op_kernel.native_available():
        pytest.skip("native kernels not built")
    op_kernel.KERNELS.set_implementation(request.param)
    yield request.param
    op_kernel.KERNELS.set_implementation(None)


def _inputs(tokens=5, blocks=3, hidden=16, seed=0):
    partial, blocks_t, proj, norm = make_inputs(tokens, blocks, hidden, seed=seed)
    proj = proj * 8  # scores of O(1): a softmax that is far from uniform, so every term of the Hessian counts
    return partial, blocks_t, proj, norm


def _penalty(function, leaves, weights):
    """A gradient penalty: sum of squares of d(sum(hidden * weights))/d(every input)."""
    hidden = function(*leaves)
    grads = torch.autograd.grad((hidden * weights).sum(), leaves, create_graph=True)
    return sum(grad.pow(2).sum() for grad in grads)


def _reference(*tensors):
    return block_attention_residuals_reference(*tensors)[0]


def _second_order(function, inputs, weights, dtype):
    leaves = [tensor.detach().to(dtype).requires_grad_() for tensor in inputs]
    _penalty(function, leaves, weights.to(dtype)).backward()
    return [leaf.grad for leaf in leaves]


def _assert_matches_reference(actual, expected, what):
    for name, got, want in zip(NAMES, actual, expected, strict=True):
        assert got is not None and got.abs().max() > 0, f"{what}: the second-order gradient of {name} is zero"
        # Second-order terms sum over tokens, rows and hidden: taken against the tensor's largest magnitude.
        error, past = max_violation(got, want, torch.float32, whole_tensor=True)
        assert past <= 0, f"{what}: {name} off the float64 reference by {error:.3e} (over by {past:.3e})"


def test_gradient_penalty_matches_reference(kernel):
    inputs = _inputs()
    weights = torch.randn(inputs[0].shape, generator=torch.Generator().manual_seed(1))
    expected = _second_order(_reference, inputs, weights, torch.float64)
    actual = _second_order(attnres_ge.block_attention_residuals, inputs, weights, torch.float32)
    _assert_matches_reference(actual, expected, f"gradient penalty ({kernel})")


def test_hessian_vector_product_matches_reference(kernel):
    inputs = _inputs(seed=2)
    generator = torch.Generator().manual_seed(3)
    weights = torch.randn(inputs[0].shape, generator=generator)
    vectors = [torch.randn(tensor.shape, generator=generator) for tensor in inputs]

    def hvp(function, dtype):
        leaves = [tensor.detach().to(dtype).requires_grad_() for tensor in inputs]
        loss = (function(*leaves) * weights.to(dtype)).sum()
        grads = torch.autograd.grad(loss, leaves, create_graph=True)
        return torch.autograd.grad(grads, leaves, grad_outputs=[v.to(dtype) for v in vectors])

    _assert_matches_reference(hvp(attnres_ge.block_attention_residuals, torch.float32),
                              hvp(_reference, torch.float64), f"Hessian-vector product ({kernel})")


def test_gradgradcheck_public_function(kernel):
    inputs = [tensor.requires_grad_() for tensor in _inputs(tokens=3, blocks=2, hidden=8)]
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*not a double precision.*")
        assert torch.autograd.gradcheck(attnres_ge.block_attention_residuals, inputs, **GRADCHECK)
        assert torch.autograd.gradgradcheck(attnres_ge.block_attention_residuals, inputs, **GRADCHECK)


def test_gradgradcheck_of_the_ops_all_outputs_and_inputs(kernel):
    """The forward's three outputs (inv_norm and probs are differentiable too) and the backward's partial
    derivatives in all seven inputs, the given statistics among them."""
    inputs = [tensor.requires_grad_() for tensor in _inputs(tokens=3, blocks=2, hidden=8)]
    forward = torch.ops.attnres.block_attention_residuals

    def forward_all(*tensors):
        return forward(*tensors, -1, 1e-6, True)

    _, inv_norm, probs = forward(*[t.detach() for t in inputs], -1, 1e-6, True)
    grad_hidden = torch.randn(3, 8, generator=torch.Generator().manual_seed(4))
    backward_inputs = [t.detach().clone().requires_grad_() for t in (*inputs, grad_hidden, inv_norm, probs)]
    backward_inputs[2] = backward_inputs[2].detach().reshape(1, -1).requires_grad_()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*not a double precision.*")
        assert torch.autograd.gradgradcheck(forward_all, inputs, **GRADCHECK)
        assert torch.autograd.gradcheck(torch.ops.attnres.block_attention_residuals_backward, backward_inputs,
                                        **GRADCHECK)


def test_probs_gradient_matches_reference(kernel):
    """A loss on the depth weights (return_probs) differentiates through them, not only hidden_states."""
    inputs = _inputs(seed=5)
    weights = torch.randn(inputs[0].shape[0], inputs[1].shape[1] + 1, generator=torch.Generator().manual_seed(6))

    def grads(function, dtype):
        leaves = [tensor.detach().to(dtype).requires_grad_() for tensor in inputs]
        hidden, probs = function(*leaves)
        (hidden.sum() + (probs * weights.to(dtype)).sum()).backward()
        return [leaf.grad for leaf in leaves]

    def reference(*tensors):
        hidden, _, probs = block_attention_residuals_reference(*tensors)
        return hidden, probs

    def ours(*tensors):
        return attnres_ge.block_attention_residuals(*tensors, return_probs=True)

    _assert_matches_reference(grads(ours, torch.float32), grads(reference, torch.float64), f"probs loss ({kernel})")


def test_first_order_backward_records_no_graph():
    """An ordinary backward runs the backward op's kernel only (no graph for a second order)."""
    leaves = [tensor.requires_grad_() for tensor in _inputs()]
    hidden = attnres_ge.block_attention_residuals(*leaves)
    grads = torch.autograd.grad(hidden.sum(), leaves)
    assert all(grad.grad_fn is None and not grad.requires_grad for grad in grads)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["inductor", "attnres_ge"])
def test_double_backward_under_torch_compile_raises(backend):
    """AOTAutograd compiles a once-differentiable backward: torch's error, never zero second-order gradients."""
    leaves = [tensor.requires_grad_() for tensor in _inputs()]
    compiled = torch.compile(attnres_ge.block_attention_residuals, backend=backend)
    grads = torch.autograd.grad(compiled(*leaves).pow(2).sum(), leaves, create_graph=True)
    with pytest.raises(RuntimeError, match="double backward"):
        sum(grad.pow(2).sum() for grad in grads).backward()


def penalty_and_func_grads() -> list[torch.Tensor]:
    """Second-order gradients of a penalty, then torch.func.grad of the loss (run with and without the C++ entry)."""
    inputs = _inputs(seed=7)
    weights = torch.randn(inputs[0].shape, generator=torch.Generator().manual_seed(8))
    second = _second_order(attnres_ge.block_attention_residuals, inputs, weights, torch.float32)

    def loss(*tensors):
        return (attnres_ge.block_attention_residuals(*tensors) * weights).sum()

    return [*second, *torch.func.grad(loss, argnums=(0, 1, 2, 3))(*inputs)]


PYTHON_ENTRY_SCRIPT = textwrap.dedent(
    """
    import sys
    sys.modules["attnres_ge.ge_plugin._cpp_entry"] = None  # as if the extension were not built
    import torch
    from attnres_ge.ge_plugin import op_common
    assert not op_common.CPP_ENTRY
    sys.path.insert(0, {tests!r})
    from test_double_backward import penalty_and_func_grads
    torch.save(penalty_and_func_grads(), {path!r})
    """
)


@pytest.mark.slow
def test_without_the_cpp_entry_the_same_bits(tmp_path):
    """The Python registrations (no C++ entry) give the same second-order and torch.func results."""
    path = tmp_path / "python_entry.pt"
    script = PYTHON_ENTRY_SCRIPT.format(tests=str(Path(__file__).parent), path=str(path))
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    for index, (python_entry, cpp_entry) in enumerate(zip(torch.load(path), penalty_and_func_grads(), strict=True)):
        assert_bitwise_equal(f"result {index}", python_entry, cpp_entry)
