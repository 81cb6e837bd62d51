"""The public function and BlockAttnRes in model code: leading dims and block lists, AMP (parameters of another
dtype, torch.autocast, mixed-dtype blocks), the module's features (reset_parameters, valid_block_num,
return_probs, torch.jit.trace, state_dict), and what must keep working: torch.compile (inductor, fullgraph,
attnres_ge), checkpointing, torch.export."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from conftest import assert_bitwise_equal, assert_close_to_reference, make_inputs

from attnres_ge import BlockAttnRes, block_attention_residuals, block_attention_residuals_reference

NAMES = ("partial_block", "block_res", "proj_weight", "norm_weight")


def _inputs(tokens=6, blocks=3, hidden=16, dtype=torch.float32, seed=0):
    partial, blocks_t, proj, norm = make_inputs(tokens, blocks, hidden, seed=seed)
    return tuple(t.to(dtype) for t in (partial, blocks_t, proj * 8, norm))


def _grads(function, tensors, grad_out):
    leaves = [t.detach().clone().requires_grad_() for t in tensors]
    out = function(*leaves)
    out.backward(grad_out)
    return out.detach(), [leaf.grad for leaf in leaves]


# ------------------------------------------------------------------------------------------------ shapes


def test_leading_dims_equal_the_flattened_call_and_the_reference():
    batch, seq, blocks, hidden = 2, 3, 4, 16
    partial, block_res, proj, norm = _inputs(batch * seq, blocks, hidden)
    grad_out = torch.randn(batch * seq, hidden, generator=torch.Generator().manual_seed(1))
    flat_out, flat_grads = _grads(block_attention_residuals, (partial, block_res, proj, norm), grad_out)
    shaped = (partial.reshape(batch, seq, hidden), block_res.reshape(batch, seq, blocks, hidden), proj, norm)
    out, grads = _grads(block_attention_residuals, shaped, grad_out.reshape(batch, seq, hidden))
    assert out.shape == (batch, seq, hidden)
    assert_bitwise_equal("hidden_states", out.reshape(-1, hidden), flat_out)
    for name, grad, flat in zip(NAMES, grads, flat_grads, strict=True):
        assert_bitwise_equal(name, grad.reshape(flat.shape), flat)
    expected = block_attention_residuals_reference(partial, block_res, proj, norm)[0]
    assert_close_to_reference("hidden_states", out.reshape(-1, hidden), expected, torch.float32)


def test_single_token_without_leading_dims():
    partial, block_res, proj, norm = _inputs(1, 2, 8)
    out = block_attention_residuals(partial[0], block_res[0], proj, norm)
    assert out.shape == (8,)
    assert_bitwise_equal("hidden_states", out, block_attention_residuals(partial, block_res, proj, norm)[0])


@pytest.mark.parametrize("container", [list, tuple])
def test_a_list_of_blocks_equals_the_stacked_tensor(container):
    batch, seq, blocks, hidden = 2, 3, 3, 16
    partial, block_res, proj, norm = _inputs(batch * seq, blocks, hidden, seed=2)
    partial, block_res = partial.reshape(batch, seq, hidden), block_res.reshape(batch, seq, blocks, hidden)
    grad_out = torch.randn(batch, seq, hidden, generator=torch.Generator().manual_seed(3))
    stacked_out, stacked_grads = _grads(block_attention_residuals, (partial, block_res, proj, norm), grad_out)
    items = [block_res[..., index, :].clone().requires_grad_() for index in range(blocks)]
    partial_leaf = partial.clone().requires_grad_()
    out = block_attention_residuals(partial_leaf, container(items), proj, norm)
    out.backward(grad_out)
    assert_bitwise_equal("hidden_states", out.detach(), stacked_out)
    assert_bitwise_equal("grad_partial_block", partial_leaf.grad, stacked_grads[0])
    for index, item in enumerate(items):
        assert_bitwise_equal(f"grad of block {index}", item.grad, stacked_grads[1][..., index, :])


@pytest.mark.parametrize(
    ("partial_shape", "block_shape"),
    [((2, 3, 8), (2, 4, 3, 8)), ((6, 8), (2, 3, 3, 8)), ((2, 3, 8), (2, 3, 3, 9)), ((2, 3, 8), (8,))],
    ids=["leading", "rank", "hidden", "too-few-dims"],
)
def test_non_matching_shapes_name_both(partial_shape, block_shape):
    _, _, proj, norm = _inputs(1, 1, 8)
    with pytest.raises(ValueError, match=r"partial_block \[.*\] and block_res \[.*\] do not match") as error:
        block_attention_residuals(torch.randn(partial_shape), torch.randn(block_shape), proj, norm)
    assert str(list(partial_shape)) in str(error.value) and str(list(block_shape)) in str(error.value)


def test_block_list_errors():
    partial, _, proj, norm = _inputs(4, 1, 8)
    with pytest.raises(ValueError, match=r"block_res is an empty list.*N >= 1"):
        block_attention_residuals(partial, [], proj, norm)
    with pytest.raises(ValueError, match=r"block_res\[1\] has shape \[4, 7\].*\[4, 8\]"):
        block_attention_residuals(partial, [partial, torch.randn(4, 7)], proj, norm)
    with pytest.raises(TypeError, match=r"block_res\[0\] must be a torch.Tensor, got NoneType"):
        block_attention_residuals(partial, [None], proj, norm)
    with pytest.raises(TypeError, match=r"block_res must be a torch.Tensor .* or a list/tuple.*got dict"):
        block_attention_residuals(partial, {}, proj, norm)
    with pytest.raises(TypeError, match=r"partial_block must be a torch.Tensor, got NoneType"):
        block_attention_residuals(None, [partial], proj, norm)


# ------------------------------------------------------------------------------------------------ dtypes


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_float32_parameters_with_low_precision_activations(dtype):
    """The op runs in the activations' dtype; the parameters' gradients come back in float32."""
    partial, block_res, proj, norm = _inputs(8, 3, 16)
    partial, block_res = partial.to(dtype), block_res.to(dtype)
    grad_out = torch.randn(8, 16, generator=torch.Generator().manual_seed(4)).to(dtype)
    out, grads = _grads(block_attention_residuals, (partial, block_res, proj, norm), grad_out)
    cast_out, cast_grads = _grads(block_attention_residuals, (partial, block_res, proj.to(dtype), norm.to(dtype)),
                                  grad_out)
    assert out.dtype == dtype and grads[2].dtype == grads[3].dtype == torch.float32
    assert_bitwise_equal("hidden_states", out, cast_out)
    for name, grad, cast in zip(NAMES, grads, cast_grads, strict=True):
        assert_bitwise_equal(name, grad, cast.to(grad.dtype))
    expected = block_attention_residuals_reference(partial, block_res, proj.to(dtype), norm.to(dtype))[0]
    assert_close_to_reference("hidden_states", out, expected, dtype)


class _TinyModel(torch.nn.Module):
    """[B, S, H] tokens through two linear blocks and a Block AttnRes layer (float32 parameters)."""

    def __init__(self, hidden=16):
        super().__init__()
        self.first = torch.nn.Linear(hidden, hidden)
        self.second = torch.nn.Linear(hidden, hidden)
        self.attn_res = BlockAttnRes(hidden)

    def forward(self, embeddings):
        first = self.first(embeddings)
        second = self.second(first)
        return self.attn_res(second, [embeddings, first])


def _model_step(model, embeddings, autocast):
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        out = model(embeddings)
    out.float().square().mean().backward()
    return out.detach(), {name: p.grad.clone() for name, p in model.named_parameters()}


def test_model_under_autocast_bf16():
    """bf16 activations from autocast's linears, float32 embeddings among the blocks (promoted: the
    stated rule), float32 parameters whose gradients stay float32."""
    torch.manual_seed(0)
    model = _TinyModel()
    with torch.no_grad():
        model.attn_res.proj_weight.normal_(0, 0.5)
    embeddings = torch.randn(2, 5, 16)
    out, grads = _model_step(model, embeddings, autocast=True)
    assert out.dtype == torch.float32  # float32 embeddings promote the bf16 blocks
    assert all(grad.dtype == torch.float32 for grad in grads.values())
    model.zero_grad()
    reference_out, _ = _model_step(model, embeddings, autocast=False)
    torch.testing.assert_close(out, reference_out, rtol=5e-2, atol=5e-2)  # bf16 linears, not the op


def test_mixed_dtype_blocks_are_promoted():
    partial, block_res, proj, norm = _inputs(4, 2, 8)
    blocks = [block_res[:, 0].to(torch.bfloat16).requires_grad_(), block_res[:, 1].requires_grad_()]
    out = block_attention_residuals(partial.to(torch.bfloat16), blocks, proj, norm)
    assert out.dtype == torch.float32
    expected = block_attention_residuals(partial.to(torch.bfloat16).float(), torch.stack(
        [blocks[0].detach().float(), blocks[1].detach()], dim=1), proj, norm)
    assert_bitwise_equal("hidden_states", out.detach(), expected)
    out.sum().backward()
    assert blocks[0].grad.dtype == torch.bfloat16 and blocks[1].grad.dtype == torch.float32


def test_float64_is_a_clear_error():
    partial, block_res, proj, norm = _inputs(4, 2, 8)
    layer = BlockAttnRes(8).double()
    with pytest.raises(TypeError, match=r"proj_weight dtype torch.float64 is not supported"):
        layer(partial, block_res)
    with pytest.raises(TypeError, match=r"activations .* dtype torch.float64 is not supported"):
        layer(partial.double(), block_res.double())


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["inductor", "attnres_ge"])
def test_autocast_model_under_torch_compile_equals_eager(backend):
    torch.manual_seed(0)
    model = _TinyModel()
    embeddings = torch.randn(2, 5, 16)
    eager_out, eager_grads = _model_step(model, embeddings, autocast=True)
    model.zero_grad()
    compiled = torch.compile(model, backend=backend, fullgraph=True)
    out, grads = _model_step(compiled, embeddings, autocast=True)
    # attnres_ge runs every other node as torch code: the same bits. Inductor fuses the bf16 linears' casts
    # and bias adds (its own rounding, not the op's): bfloat16 tolerance.
    tolerance = {"rtol": 0, "atol": 0} if backend == "attnres_ge" else {"rtol": 1.6e-2, "atol": 1e-2}
    torch.testing.assert_close(out, eager_out, **tolerance)
    for name, grad in grads.items():
        torch.testing.assert_close(grad, eager_grads[name.removeprefix("_orig_mod.")], **tolerance)


# ------------------------------------------------------------------------------------------------ module


def test_reset_parameters_after_meta_init():
    with torch.device("meta"):
        layer = BlockAttnRes(8)
    layer.to_empty(device="cpu")
    layer.reset_parameters()
    fresh = BlockAttnRes(8)
    assert torch.equal(layer.proj_weight, fresh.proj_weight) and torch.equal(layer.norm_weight, fresh.norm_weight)
    assert torch.equal(fresh.proj_weight, torch.zeros(1, 8)) and torch.equal(fresh.norm_weight, torch.ones(8))


def test_return_probs_and_valid_block_num():
    partial, block_res, proj, norm = _inputs(6, 3, 16)
    layer = BlockAttnRes(16)
    layer.load_state_dict({"proj_weight": proj, "norm_weight": norm})
    shaped = partial.reshape(2, 3, 16), block_res.reshape(2, 3, 3, 16)
    out, probs = layer(*shaped, valid_block_num=3, return_probs=True)
    assert probs.shape == (2, 3, 4) and probs.dtype == torch.float32
    _, _, expected = block_attention_residuals_reference(partial, block_res, proj, norm)
    assert_close_to_reference("probs", probs.reshape(6, 4), expected, torch.float32)
    assert_bitwise_equal("hidden_states", out, layer(*shaped))
    with pytest.raises(Exception, match="valid_block_num"):
        layer(*shaped, valid_block_num=2)


def test_state_dict_round_trip():
    partial, block_res, proj, norm = _inputs(4, 2, 8)
    layer = BlockAttnRes(8)
    layer.load_state_dict({"proj_weight": proj, "norm_weight": norm})
    copy = BlockAttnRes(8)
    copy.load_state_dict(layer.state_dict())
    assert_bitwise_equal("hidden_states", copy(partial, block_res), layer(partial, block_res))


def test_jit_trace_check_passes_and_replays():
    partial, block_res, proj, norm = _inputs(4, 2, 8)
    layer = BlockAttnRes(8)
    layer.load_state_dict({"proj_weight": proj, "norm_weight": norm})
    traced = torch.jit.trace(layer, (partial, block_res))  # runs its check: raises if the graphs differ
    with torch.no_grad():
        assert_bitwise_equal("hidden_states", traced(partial, block_res), layer(partial, block_res))
    leaves = [partial.clone().requires_grad_(), block_res.clone().requires_grad_()]
    traced(*leaves).sum().backward()
    _, grads = _grads(lambda p, b: layer(p, b), (partial, block_res), torch.ones(4, 8))
    assert_bitwise_equal("grad_partial_block", leaves[0].grad, grads[0])


# ------------------------------------------------------------------------------------------------ keeps working


def test_checkpointing_equals_a_plain_backward():
    partial, block_res, proj, norm = _inputs(6, 3, 16)
    layer = BlockAttnRes(16)
    layer.load_state_dict({"proj_weight": proj, "norm_weight": norm})

    def run(checkpointed):
        leaves = [partial.clone().requires_grad_(), block_res.clone().requires_grad_()]
        layer.zero_grad()
        call = (lambda *t: torch.utils.checkpoint.checkpoint(layer, *t, use_reentrant=False)) if checkpointed else layer
        call(*leaves).square().sum().backward()
        return [leaf.grad for leaf in leaves] + [layer.proj_weight.grad.clone(), layer.norm_weight.grad.clone()]

    for name, plain, checkpointed in zip(NAMES, run(False), run(True), strict=True):
        assert_bitwise_equal(name, checkpointed, plain)


@pytest.mark.slow
def test_torch_export_and_aot_inductor(tmp_path):
    partial, block_res, proj, norm = _inputs(6, 3, 16)
    layer = BlockAttnRes(16)
    layer.load_state_dict({"proj_weight": proj, "norm_weight": norm})
    shaped = (partial.reshape(2, 3, 16), block_res.reshape(2, 3, 3, 16))
    with torch.no_grad():
        expected = layer(*shaped)
        exported = torch.export.export(layer, shaped)
        assert_bitwise_equal("exported", exported.module()(*shaped), expected)
        package = torch._inductor.aoti_compile_and_package(exported, package_path=str(tmp_path / "layer.pt2"))
        loaded = torch._inductor.aoti_load_package(package)
        torch.testing.assert_close(loaded(*shaped), expected, rtol=0, atol=0)


def test_the_documented_autocast_snippet_runs():
    """docs/using.md's first example: a [B, S, H] model under autocast, bf16 activations, float32 gradients."""
    text = (Path(__file__).parents[1] / "docs" / "using.md").read_text()
    snippet = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    namespace: dict = {}
    exec(compile(snippet, "docs/using.md", "exec"), namespace)  # noqa: S102  (the repository's own example)
    assert namespace["x"].shape == (8, 64, 256) and namespace["x"].dtype == torch.bfloat16
    mixers = [*namespace["attn_mixers"], *namespace["mlp_mixers"], namespace["final_mixer"]]
    grads = [layer.proj_weight.grad for layer in mixers]
    assert all(grad is not None and grad.dtype == torch.float32 for grad in grads)
    # The first read has one candidate (the embeddings, nothing sealed): its softmax is 1, its gradient zero.
    assert grads[0].abs().max() == 0
    assert all(grad.abs().max() > 0 for grad in grads[1:])


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["inductor", "attnres_ge"])
def test_a_loss_on_probs_under_torch_compile_equals_eager(backend):
    """The statistics' gradient (torch formulas) traced into the compiled backward."""
    inputs = _inputs(5, 3, 16)

    def loss(*tensors):
        hidden, probs = block_attention_residuals(*tensors, return_probs=True)
        return hidden.square().sum() + (probs * torch.arange(4.0)).sum()

    def grads(function):
        leaves = [tensor.clone().requires_grad_() for tensor in inputs]
        function(*leaves).backward()
        return [leaf.grad for leaf in leaves]

    tolerance = {"rtol": 0, "atol": 0} if backend == "attnres_ge" else {"rtol": 1e-5, "atol": 1e-5}
    for compiled, eager in zip(grads(torch.compile(loss, backend=backend, fullgraph=True)), grads(loss), strict=True):
        torch.testing.assert_close(compiled, eager, **tolerance)
