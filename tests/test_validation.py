"""Every validation rule of docs/contract.md, at the eager call and under torch.compile, with its message."""

from __future__ import annotations

import math
import re

import pytest
import torch
from conftest import make_inputs

from attnres_ge.op_proto import WHERE_EAGER, WHERE_FAKE, AttnResInputError

forward_op = torch.ops.attnres.block_attention_residuals
backward_op = torch.ops.attnres.block_attention_residuals_backward
T, N, H = 6, 3, 8
EPS_RULE = "attribute norm_eps must be finite and > 0 as a float32 (how GE stores it)"


def forward_args(**changes):
    partial, blocks, proj, norm = make_inputs(T, N, H)
    args = {
        "partial_block": partial,
        "block_res": blocks,
        "proj_weight": proj,
        "norm_weight": norm,
        "valid_block_num": -1,
        "norm_eps": 1e-6,
        "need_backward": True,
    }
    args.update(changes)
    return args


def backward_args(**changes):
    partial, blocks, proj, norm = make_inputs(T, N, H)
    args = {
        "partial_block": partial,
        "block_res": blocks,
        "proj_weight": proj,
        "norm_weight": norm,
        "grad_hidden_states": torch.ones(T, H),
        "inv_norm": torch.ones(T, N + 1),
        "probs": torch.full((T, N + 1), 0.25),
    }
    args.update(changes)
    return args


FORWARD_CASES = [
    (
        "float64-inputs",
        dict(partial_block=torch.ones(T, H, dtype=torch.float64)),
        "partial_block must have dtype in (torch.float16, torch.bfloat16, torch.float32), got torch.float64",
    ),
    (
        "mixed-dtypes",
        dict(block_res=torch.ones(T, N, H, dtype=torch.float16)),
        "block_res must have the dtype of partial_block (torch.float32), got torch.float16",
    ),
    (
        "norm-weight-dtype",
        dict(norm_weight=torch.ones(H, dtype=torch.bfloat16)),
        "norm_weight must have the dtype of partial_block (torch.float32), got torch.bfloat16",
    ),
    (
        "partial-rank",
        dict(partial_block=torch.ones(T, 1, H)),
        "partial_block must be 2-D [T, H] = [*, *], got shape [6, 1, 8]",
    ),
    (
        "block-res-rank",
        dict(block_res=torch.ones(T, H)),
        "block_res must be 3-D [T, N, H] = [6, *, 8], got shape [6, 8]",
    ),
    (
        "block-res-tokens",
        dict(block_res=torch.ones(T + 1, N, H)),
        "block_res must have shape [T, N, H] = [6, *, 8], got [7, 3, 8]",
    ),
    (
        "block-res-hidden",
        dict(block_res=torch.ones(T, N, H + 1)),
        "block_res must have shape [T, N, H] = [6, *, 8], got [6, 3, 9]",
    ),
    ("proj-shape", dict(proj_weight=torch.ones(2, H)), "proj_weight must have shape [1, H] = [1, 8], got [2, 8]"),
    ("proj-1d-shape", dict(proj_weight=torch.ones(H + 2)), "proj_weight must have shape [H] = [8], got [10]"),
    ("norm-shape", dict(norm_weight=torch.ones(1, H)), "norm_weight must be 1-D [H] = [8], got shape [1, 8]"),
    (
        "no-blocks",
        dict(block_res=torch.ones(T, 0, H)),
        "block_res must have 1 <= N <= 100 (completed blocks), got N = 0",
    ),
    (
        "too-many-blocks",
        dict(block_res=torch.ones(T, 101, H)),
        "block_res must have 1 <= N <= 100 (completed blocks), got N = 101",
    ),
    (
        "empty-hidden",
        dict(
            partial_block=torch.ones(T, 0),
            block_res=torch.ones(T, N, 0),
            proj_weight=torch.ones(1, 0),
            norm_weight=torch.ones(0),
        ),
        "partial_block must have H >= 1 (hidden size), got H = 0",
    ),
    ("eps-zero", dict(norm_eps=0.0), f"{EPS_RULE}, got 0.0"),
    ("eps-negative", dict(norm_eps=-1e-6), f"{EPS_RULE}, got -1e-06"),
    ("eps-inf", dict(norm_eps=math.inf), f"{EPS_RULE}, got inf"),
    ("eps-nan", dict(norm_eps=math.nan), f"{EPS_RULE}, got nan"),
    ("eps-underflows-float32", dict(norm_eps=1e-46), f"{EPS_RULE}, got 1e-46 (0.0 as float32)"),
    ("eps-far-below-float32", dict(norm_eps=1e-300), f"{EPS_RULE}, got 1e-300 (0.0 as float32)"),
    ("eps-overflows-float32", dict(norm_eps=3.5e38), f"{EPS_RULE}, got 3.5e+38 (inf as float32)"),
    *[
        (f"{name}-none", {name: None}, f"{name} must be a tensor {layout}, got None")
        for name, layout in [("partial_block", "[T, H]"), ("block_res", "[T, N, H]"),
                             ("proj_weight", "[1, H] or [H]"), ("norm_weight", "[H]")]
    ],
    (
        "valid-block-num",
        dict(valid_block_num=2),
        "attribute valid_block_num is reserved and must be -1 or N = 3, got 2",
    ),
    (
        "device-mismatch",
        dict(norm_weight=torch.ones(H, device="meta")),
        "all tensors must be on one device, got partial_block on cpu, block_res on cpu, proj_weight on cpu, "
        "norm_weight on meta",
    ),
]

BACKWARD_CASES = [
    *[
        (f"{name}-none", {name: None}, f"{name} must be a tensor")
        for name in ("partial_block", "block_res", "proj_weight", "norm_weight", "grad_hidden_states", "inv_norm",
                     "probs")
    ],
    (
        "float64-inputs",
        dict(partial_block=torch.ones(T, H, dtype=torch.float64)),
        "partial_block must have dtype in (torch.float16, torch.bfloat16, torch.float32), got torch.float64",
    ),
    (
        "grad-dtype",
        dict(grad_hidden_states=torch.ones(T, H, dtype=torch.float16)),
        "grad_hidden_states must have the dtype of partial_block (torch.float32), got torch.float16",
    ),
    (
        "inv-norm-dtype",
        dict(inv_norm=torch.ones(T, N + 1, dtype=torch.float16)),
        "inv_norm must have dtype in (torch.float32), got torch.float16",
    ),
    (
        "probs-dtype",
        dict(probs=torch.ones(T, N + 1, dtype=torch.bfloat16)),
        "probs must have dtype in (torch.float32), got torch.bfloat16",
    ),
    ("proj-1d", dict(proj_weight=torch.ones(H)), "proj_weight must be 2-D [1, H] = [1, 8], got shape [8]"),
    (
        "grad-shape",
        dict(grad_hidden_states=torch.ones(T, H + 1)),
        "grad_hidden_states must have shape [T, H] = [6, 8], got [6, 9]",
    ),
    ("probs-shape", dict(probs=torch.ones(T, N)), "probs must have shape [T, N+1] = [6, 4], got [6, 3]"),
    ("inv-norm-rank", dict(inv_norm=torch.ones(T)), "inv_norm must be 2-D [T, N+1] = [6, 4], got shape [6]"),
    (
        "too-many-blocks",
        dict(block_res=torch.ones(T, 129, H), inv_norm=torch.ones(T, 130), probs=torch.ones(T, 130)),
        "block_res must have 0 <= N <= 128 (completed blocks), got N = 129",
    ),
    ("device-mismatch", dict(probs=torch.ones(T, N + 1, device="meta")), "all tensors must be on one device"),
]


def call_forward(args):
    return forward_op(
        args["partial_block"],
        args["block_res"],
        args["proj_weight"],
        args["norm_weight"],
        args["valid_block_num"],
        args["norm_eps"],
        args["need_backward"],
    )


def call_backward(args):
    return backward_op(*args.values())


def expect_error(call, args, message, where, exception=AttnResInputError):
    if any(isinstance(v, torch.Tensor) and v.device.type == "meta" for v in args.values()):
        where = WHERE_FAKE  # a meta tensor sends even the eager call to the fake/meta kernel
    with pytest.raises(exception) as caught:
        call(args)
    text = str(caught.value)
    assert message in text, f"message {message!r} not in {text!r}"
    assert re.search(rf"BlockAttentionResiduals(Grad)? \({re.escape(where)}\)", text), text


@pytest.mark.parametrize(("changes", "message"), [pytest.param(c, m, id=i) for i, c, m in FORWARD_CASES])
def test_forward_rejects_at_eager_call(changes, message):
    expect_error(call_forward, forward_args(**changes), message, WHERE_EAGER)


@pytest.mark.parametrize(("changes", "message"), [pytest.param(c, m, id=i) for i, c, m in BACKWARD_CASES])
def test_backward_rejects_at_eager_call(changes, message):
    expect_error(call_backward, backward_args(**changes), message, WHERE_EAGER)


# Under torch.compile the fake implementation runs the same checks while dynamo traces;
# dynamo re-raises them wrapped, with the original message kept.
COMPILE_ERRORS = (AttnResInputError, torch._dynamo.exc.TorchRuntimeError)


@pytest.mark.parametrize(("changes", "message"), [pytest.param(c, m, id=i) for i, c, m in FORWARD_CASES])
def test_forward_rejects_under_torch_compile(changes, message):
    compiled = torch.compile(call_forward, backend="eager", fullgraph=True)
    expect_error(compiled, forward_args(**changes), message, WHERE_FAKE, COMPILE_ERRORS)


@pytest.mark.parametrize(("changes", "message"), [pytest.param(c, m, id=i) for i, c, m in BACKWARD_CASES])
def test_backward_rejects_under_torch_compile(changes, message):
    compiled = torch.compile(call_backward, backend="eager", fullgraph=True)
    expect_error(compiled, backward_args(**changes), message, WHERE_FAKE, COMPILE_ERRORS)


@pytest.mark.parametrize("call", [call_forward, call_backward])
@pytest.mark.parametrize("bad", [[[1.0] * H] * T, 2.0, "x"], ids=["list", "float", "str"])
def test_a_non_tensor_where_a_tensor_belongs_is_named(call, bad):
    args = (forward_args if call is call_forward else backward_args)(block_res=bad)
    with pytest.raises(RuntimeError, match=r"for argument 'block_res'"):  # torch's schema check, before ours
        call(args)


def test_attribute_of_wrong_type_is_rejected():
    from attnres_ge.op_proto import FORWARD

    with pytest.raises(AttnResInputError, match=r"attribute 'need_backward' must be Bool, got int 1"):
        FORWARD.bind_attrs({"need_backward": 1})
    with pytest.raises(AttnResInputError, match=r"unknown attribute 'normEps'"):
        FORWARD.bind_attrs({"normEps": 1e-6})


def test_valid_block_num_equal_to_n_is_accepted():
    args = forward_args(valid_block_num=N)
    hidden, _, _ = call_forward(args)
    assert hidden.shape == (T, H)
