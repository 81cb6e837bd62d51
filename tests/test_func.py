"""torch.func transforms (grad, vjp, jacrev, vmap, per-sample gradients, hessian of a penalty) over the ops
and the public function: the same results as plain autograd."""

from __future__ import annotations

import pytest
import torch
from conftest import make_inputs

import attnres_ge

function = attnres_ge.block_attention_residuals


def _inputs(tokens=4, blocks=3, hidden=8, seed=0):
    partial, blocks_t, proj, norm = make_inputs(tokens, blocks, hidden, seed=seed)
    return partial, blocks_t, proj * 8, norm


def _loss(partial, blocks, proj, norm):
    return function(partial, blocks, proj, norm).tanh().sum()


def _autograd_grads(loss, inputs):
    leaves = [tensor.detach().clone().requires_grad_() for tensor in inputs]
    return torch.autograd.grad(loss(*leaves), leaves)


def _assert_all_close(actual, expected, what):
    for index, (got, want) in enumerate(zip(actual, expected, strict=True)):
        message = f"{what}, input {index}"
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6, msg=lambda m, message=message: f"{message}: {m}")


def test_grad_matches_autograd():
    inputs = _inputs()
    grads = torch.func.grad(_loss, argnums=(0, 1, 2, 3))(*inputs)
    _assert_all_close(grads, _autograd_grads(_loss, inputs), "torch.func.grad")


def test_vjp_matches_autograd_with_statistics():
    inputs = _inputs(seed=1)
    op = torch.ops.attnres.block_attention_residuals

    def forward(*tensors):
        return op(*tensors, -1, 1e-6, True)

    outputs, pullback = torch.func.vjp(forward, *inputs)
    generator = torch.Generator().manual_seed(2)
    cotangents = tuple(torch.randn(output.shape, generator=generator) for output in outputs)
    leaves = [tensor.detach().clone().requires_grad_() for tensor in inputs]
    expected = torch.autograd.grad(forward(*leaves), leaves, cotangents)
    _assert_all_close(pullback(cotangents), expected, "torch.func.vjp")


def test_jacrev_matches_autograd():
    partial, blocks, proj, norm = _inputs(tokens=2, blocks=2, hidden=4, seed=3)
    jacobian = torch.func.jacrev(lambda x: function(partial, blocks, proj, x))(norm)
    expected = torch.autograd.functional.jacobian(lambda x: function(partial, blocks, proj, x), norm)
    torch.testing.assert_close(jacobian, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("batched_weights", [False, True], ids=["shared-weights", "batched-weights"])
def test_vmap_matches_a_loop(batched_weights):
    batch = 3
    samples = [_inputs(seed=10 + index) for index in range(batch)]
    stacked = [torch.stack(tensors) for tensors in zip(*samples, strict=True)]
    if not batched_weights:
        stacked[2:] = samples[0][2:]
        samples = [(*sample[:2], *samples[0][2:]) for sample in samples]
    in_dims = (0, 0, 0, 0) if batched_weights else (0, 0, None, None)
    result = torch.func.vmap(function, in_dims=in_dims)(*stacked)
    expected = torch.stack([function(*sample) for sample in samples])
    torch.testing.assert_close(result, expected, rtol=0, atol=0)


def test_per_sample_gradients_match_autograd():
    """vmap(grad) over a batch of sequences: one gradient of the weights per sample."""
    batch = 3
    samples = [_inputs(seed=20 + index) for index in range(batch)]
    proj, norm = samples[0][2], samples[0][3]
    partials = torch.stack([sample[0] for sample in samples])
    blocks = torch.stack([sample[1] for sample in samples])

    def sample_loss(weights, partial, block_res):
        return _loss(partial, block_res, *weights)

    per_sample = torch.func.vmap(torch.func.grad(sample_loss), in_dims=(None, 0, 0))((proj, norm), partials, blocks)
    for index in range(batch):
        expected = _autograd_grads(lambda p, n, i=index: sample_loss((p, n), partials[i], blocks[i]), (proj, norm))
        _assert_all_close([per_sample[0][index], per_sample[1][index]], expected, f"sample {index}")


def test_hessian_of_a_gradient_penalty_matches_autograd():
    """jacrev(grad): second order under torch.func, through the backward op's own backward."""
    partial, blocks, proj, norm = _inputs(tokens=2, blocks=2, hidden=4, seed=30)
    hessian = torch.func.jacrev(torch.func.grad(lambda x: _loss(partial, blocks, proj, x)))(norm)
    expected = torch.autograd.functional.hessian(lambda x: _loss(partial, blocks, proj, x), norm)
    torch.testing.assert_close(hessian, expected, rtol=1e-4, atol=1e-5)


def test_forward_mode_jvp_and_hessian_match_autograd():
    """jvp (forward mode through the torch formulas) and hessian (jacfwd over jacrev)."""
    partial, blocks, proj, norm = _inputs(tokens=2, blocks=2, hidden=4, seed=40)
    tangent = torch.randn(norm.shape, generator=torch.Generator().manual_seed(41))
    _, jvp_out = torch.func.jvp(lambda x: function(partial, blocks, proj, x), (norm,), (tangent,))
    jacobian = torch.autograd.functional.jacobian(lambda x: function(partial, blocks, proj, x), norm)
    torch.testing.assert_close(jvp_out, jacobian @ tangent, rtol=1e-4, atol=1e-5)
    hessian = torch.func.hessian(lambda x: _loss(partial, blocks, proj, x))(norm)
    expected = torch.autograd.functional.hessian(lambda x: _loss(partial, blocks, proj, x), norm)
    torch.testing.assert_close(hessian, expected, rtol=1e-4, atol=1e-5)
