"""The op (attnres_ge.fused_attnres) against FLA's own `naive_attnres`, gradients included.

test_general_read_reference.py checks the float64 oracle against the peers; here the op itself meets them:
the op's float32 results against FLA's formula run at float64 (its Tensor.float() redirected, as there) on
the same float32-rounded inputs, within docs/contract.md's float32 tolerance, elementwise for the output,
the weights and the input gradients, relative to the largest magnitude for the gradients of the query and
of the two norm weights (sums over tokens, where terms cancel). Several queries are several FLA calls.
The comparison with transformers' Inkling2 module is in test_transformers_integration.py.
"""

from __future__ import annotations

import pytest
import torch
from test_general_read_reference import HIDDEN, float32_math_in_float64, naive_attnres  # noqa: F401 (fixture)

from attnres_ge import fused_attnres, op_kernel
from attnres_ge.op_kernel.reference import max_violation


@pytest.fixture(scope="module", autouse=True)
def oracle_kernels():
    """This module checks the semantics against FLA's own code: on the float64 Python kernels, so that what it
    measures is the two definitions' agreement. The native kernels' rounding is checked against the float64
    formulas with the contract's allowance in tests/test_read_native.py."""
    before = op_kernel.KERNELS.implementation
    op_kernel.KERNELS.set_implementation("python")
    yield
    op_kernel.KERNELS.set_implementation(before)


def assert_within_float32(name: str, actual: torch.Tensor, expected: torch.Tensor, *, whole_tensor=False):
    """Within the contract's float32 tolerance of the float64 `expected` (relative to max |expected| for
    sums over tokens)."""
    assert actual.shape == expected.shape, f"{name}: shape {list(actual.shape)}, expected {list(expected.shape)}"
    error, past = max_violation(actual, expected, torch.float32, whole_tensor=whole_tensor)
    assert past <= 0, f"{name} is off the float64 peer by {error:.3e}, {past:.3e} past the float32 tolerance"


def float32_leaves(*tensors):
    """Each tensor (float64) rounded to float32, and the float64 copy of that rounding, both leaves needing
    gradients: (op inputs, peer inputs). None stays None."""
    rounded = [None if t is None else t.float() for t in tensors]
    ours = [None if t is None else t.clone().requires_grad_() for t in rounded]
    theirs = [None if t is None else t.double().requires_grad_() for t in rounded]
    return ours, theirs


def read_inputs(lead, sources, queries, *, seed):
    """(query [S, H], sources: L tensors [*lead, H], key weight [H], output weight [H], grad_out [S, *lead, H]),
    float64. A third of the rows have RMS 1e-3 (mean v^2 = eps = 1e-6, so eps matters), the rest 0.1..10."""
    generator = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=generator, dtype=torch.float64)

    def rms(*shape):
        uniform = torch.rand(*shape, generator=generator, dtype=torch.float64)
        return torch.where(uniform < 1 / 3, 1e-3, 10 ** (3 * uniform - 2))

    rows = [randn(*lead, HIDDEN) * rms(*lead, 1) for _ in range(sources)]
    weights = [0.5 + torch.rand(HIDDEN, generator=generator, dtype=torch.float64) for _ in range(2)]
    return randn(queries, HIDDEN) * 0.5, rows, *weights, randn(queries, *lead, HIDDEN)


FLA_CASES = {  # id: (lead dims, L, S, key-norm weight, output-norm weight, scale)
    "B2T3-L130-S1-both-weights": ((2, 3), 130, 1, True, True, 1.3),
    "T4-L5-S1-key-weight": ((4,), 5, 1, True, False, HIDDEN**-0.5),
    "T4-L1-S1-output-norm": ((4,), 1, 1, True, True, 0.7),
    "B2T3-L7-S3-shared-weights": ((2, 3), 7, 3, True, True, 1.3),
}


@pytest.mark.parametrize("case", FLA_CASES.values(), ids=FLA_CASES.keys())
def test_op_against_fla_naive_attnres(naive_attnres, case):  # noqa: F811 (the fixture)
    """Output, depth weights and the gradient of every input (query, each residual, rms_weight,
    output_rms_weight)."""
    lead, sources, queries, weighted, normed, scale = case
    query, rows, key_weight, output_weight, grad_out = read_inputs(lead, sources, queries, seed=sources + queries)
    ours, theirs = float32_leaves(query if queries > 1 else query[0], *rows, key_weight,
                                  output_weight if normed else None)
    out, probs = fused_attnres(ours[0], ours[1:-2], ours[-2], ours[-1], 1e-6, scale, True)
    with float32_math_in_float64():
        peer = [naive_attnres(q, theirs[1:-2], theirs[-2], theirs[-1], 1e-6, scale, True)
                for q in theirs[0].reshape(queries, HIDDEN)]
    expected_out = torch.stack([o for o, _ in peer]).reshape(out.shape)
    expected_probs = torch.stack([p for _, p in peer]).reshape(probs.shape)
    assert out.dtype == torch.float32 and probs.dtype == torch.float32
    assert_within_float32("o", out, expected_out.detach())
    assert_within_float32("p", probs, expected_probs)

    grad = grad_out.float().reshape(out.shape)
    wanted = [(index, leaf) for index, leaf in enumerate(ours) if leaf is not None]
    grads = torch.autograd.grad(out, [leaf for _, leaf in wanted], grad)
    expected_grads = torch.autograd.grad(expected_out, [theirs[index] for index, _ in wanted], grad.double())
    names = ["query", *(f"residuals[{i}]" for i in range(sources)), "rms_weight", "output_rms_weight"]
    for (index, _), actual, expected in zip(wanted, grads, expected_grads, strict=True):
        summed_over_tokens = index == 0 or index >= 1 + sources
        assert_within_float32(f"grad {names[index]}", actual, expected, whole_tensor=summed_over_tokens)
