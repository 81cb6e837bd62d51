"""The two-phase ops, BlockAttnResPrepare and BlockAttnResUpdate (docs/contract.md, "The two-phase ops"):
numerics against the float64 reference, a read through both equal to the per-layer forward op, in-place
update semantics, every validation rule in the eager and fake paths, opcheck, gradients, and the same bits
for every thread count and tiling."""

from __future__ import annotations

import re

import pytest
import torch
from conftest import HOST_SAMPLE, assert_bitwise_equal, host, make_inputs
from torch._subclasses.fake_tensor import FakeTensorMode

from attnres_ge.op_host.platform import KIB, PlatformInfo
from attnres_ge.op_kernel.block_attn_res_prepare import KERNEL as PREPARE_KERNEL
from attnres_ge.op_kernel.block_attn_res_update import KERNEL as UPDATE_KERNEL
from attnres_ge.op_kernel.launcher import HostRuntime
from attnres_ge.op_kernel.reference import (
    LOWEST_FLOAT32,
    TOLERANCES,
    block_attn_res_prepare_reference,
    block_attn_res_update_reference,
    max_violation,
)
from attnres_ge.op_proto import WHERE_EAGER, WHERE_FAKE, AttnResInputError

prepare_op = torch.ops.attnres.block_attn_res_prepare
update_op = torch.ops.attnres.block_attn_res_update
forward_op = torch.ops.attnres.block_attention_residuals
DTYPE_IDS = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}


def assert_within(name, actual, expected, dtype):
    """Within docs/contract.md's tolerance for `dtype` of the float64 reference."""
    error, past = max_violation(actual, expected, dtype)
    assert past <= 0, f"{name} ({dtype}) drifted from the float64 reference: max |err| {error:.3e}, over by {past:.3e}"


def count(value: int) -> torch.Tensor:
    return torch.tensor([value], dtype=torch.uint64)


def prepare_inputs(tokens, blocks, queries, hidden, seed=0):
    """(block_res [T, N, D], pseudo_query [S, D]): unit-variance snapshots, queries scaled like a folded
    norm_weight * proj_weight (so that the softmax over depth is neither flat nor one-hot)."""
    generator = torch.Generator().manual_seed(seed)
    block_res = torch.randn(tokens, blocks, hidden, generator=generator)
    pseudo_query = torch.randn(queries, hidden, generator=generator) * 2 / max(hidden, 1) ** 0.5
    return block_res, pseudo_query


def update_inputs(tokens, hidden, delta_dtype, state, seed=1):
    """(partial_block, delta, pseudo_query, numerator, logit_max, exp_sum) for one slot of `state`
    (prepare's outputs, slot 0) or the empty state when `state` is None."""
    generator = torch.Generator().manual_seed(seed)
    partial = torch.randn(tokens, hidden, generator=generator)
    delta = torch.randn(tokens, hidden, generator=generator).to(delta_dtype)
    query = torch.randn(hidden, generator=generator) * 2 / max(hidden, 1) ** 0.5
    if state is None:
        state = (torch.zeros(tokens, hidden), torch.full((tokens,), LOWEST_FLOAT32), torch.zeros(tokens))
    else:
        state = tuple(output[0].contiguous() for output in state)
    return (partial, delta, query, *state)


# ------------------------------------------------------------------------------------------ numerics

PREPARE_SHAPES = [  # (T, N, S, D, valid_blocks)
    pytest.param(6, 5, 3, 40, 3, id="T6-N5-S3-D40-Nv3"),
    pytest.param(6, 5, 3, 40, 5, id="T6-N5-S3-D40-Nv5"),
    pytest.param(6, 5, 3, 40, 9, id="T6-N5-S3-D40-valid9-past-N"),
    pytest.param(6, 5, 3, 40, 2**64 - 1, id="T6-N5-S3-D40-valid-uint64-max"),
    pytest.param(6, 5, 3, 40, 0, id="T6-N5-S3-D40-valid0-empty"),
    pytest.param(0, 4, 2, 16, 2, id="T0-N4-S2-D16"),
    pytest.param(5, 4, 0, 16, 2, id="T5-N4-S0-D16"),
    pytest.param(9, 1, 2, 1, 1, id="T9-N1-S2-D1"),
    pytest.param(3, 64, 4, 24, 64, id="T3-N64-S4-D24"),
    pytest.param(3, 64, 2, 24, 37, id="T3-N64-S2-D24-Nv37"),
    pytest.param(2, 3, 2, 8192, 3, id="T2-N3-S2-D8192"),
    pytest.param(33, 7, 5, 1000, 6, id="T33-N7-S5-D1000-odd"),
]


@pytest.mark.parametrize(("tokens", "blocks", "queries", "hidden", "valid"), PREPARE_SHAPES)
def test_prepare_matches_the_float64_reference(tokens, blocks, queries, hidden, valid):
    block_res, pseudo_query = prepare_inputs(tokens, blocks, queries, hidden)
    outputs = prepare_op(block_res, count(valid), pseudo_query)
    expected = block_attn_res_prepare_reference(block_res, count(valid), pseudo_query)
    for name, actual, reference in zip(("numerator", "logit_max", "exp_sum"), outputs, expected, strict=True):
        assert actual.dtype == torch.float32 and actual.shape == reference.shape, name
        assert_within(name, actual, reference, torch.float32)


# The share of float32's tolerance prepare may use at the large-logit cases below. The kernels use about
# 0.002-0.006 of it; float32 sums over D (pass 1 in float32 runs, tried: docs/kernels.md, "The two-phase
# kernels") used 0.5-2.0 of it at these shapes.
LARGE_LOGIT_SHARE = 0.05


@pytest.mark.parametrize("offset", [0.0, 3.0, 10.0], ids=["unit", "one-sign", "one-sign-offset10"])
def test_prepare_keeps_a_margin_with_large_logits(offset):
    """Unit-scale queries at D = 8192 give logits of about 90; rows and queries of one sign (rows offset,
    queries' magnitudes) logits of thousands. The numerator and exp_sum then carry the logits' absolute
    error as a relative one."""
    generator = torch.Generator().manual_seed(5)
    block_res = torch.randn(4, 8, 8192, generator=generator) + offset
    pseudo_query = torch.randn(8, 8192, generator=generator)
    if offset:
        pseudo_query = pseudo_query.abs()
    outputs = prepare_op(block_res, count(8), pseudo_query)
    expected = block_attn_res_prepare_reference(block_res, count(8), pseudo_query)
    rtol, atol = TOLERANCES[torch.float32]
    for name, actual, reference in zip(("numerator", "logit_max", "exp_sum"), outputs, expected, strict=True):
        share = ((actual.double() - reference).abs() / (atol + rtol * reference.abs())).max().item()
        assert share <= LARGE_LOGIT_SHARE, f"{name} used {share:.3f} of float32's tolerance at offset {offset}"


def test_prepare_with_no_valid_block_writes_the_empty_state():
    block_res, pseudo_query = prepare_inputs(4, 3, 2, 16)
    numerator, logit_max, exp_sum = prepare_op(block_res, count(0), pseudo_query)
    assert torch.equal(numerator, torch.zeros(2, 4, 16))
    assert torch.equal(logit_max, torch.full((2, 4), LOWEST_FLOAT32))
    assert torch.equal(exp_sum, torch.zeros(2, 4))
    assert logit_max[0, 0].item() == -3.4028234663852886e38  # the lowest finite float32, exactly


UPDATE_SHAPES = [  # (T, D, whether the state comes from prepare or is empty)
    pytest.param(7, 40, True, id="T7-D40-prepared"),
    pytest.param(7, 40, False, id="T7-D40-empty-state"),
    pytest.param(0, 16, True, id="T0-D16"),
    pytest.param(4, 0, False, id="T4-D0"),
    pytest.param(5, 1, True, id="T5-D1"),
    pytest.param(3, 8192, True, id="T3-D8192"),
    pytest.param(37, 1000, True, id="T37-D1000-odd"),
]


@pytest.mark.parametrize("delta_dtype", [pytest.param(d, id=i) for d, i in DTYPE_IDS.items()])
@pytest.mark.parametrize(("tokens", "hidden", "prepared"), UPDATE_SHAPES)
def test_update_matches_the_float64_reference(tokens, hidden, prepared, delta_dtype):
    state = None
    if prepared:
        block_res, queries = prepare_inputs(tokens, 4, 1, max(hidden, 1))
        state = prepare_op(block_res[..., :hidden].contiguous(), count(3), queries[:, :hidden].contiguous())
    inputs = update_inputs(tokens, hidden, delta_dtype, state)
    # The reference starts from the same (already rounded) delta the op receives.
    expected_partial, expected_h = block_attn_res_update_reference(*inputs)
    partial = inputs[0]
    h = update_op(*inputs)
    assert h.dtype == delta_dtype and h.shape == (tokens, hidden)
    assert_within("partial_block", partial, expected_partial, torch.float32)
    assert_within("h", h, expected_h, delta_dtype)


def test_update_from_the_empty_state_returns_the_updated_stream():
    partial, delta, query, *empty = update_inputs(6, 32, torch.float32, None)
    expected = partial + delta
    h = update_op(partial, delta, query, *empty)
    assert_bitwise_equal("partial_block", partial, expected)
    assert_bitwise_equal("h", h, expected)


# A read through the two phases is the per-layer forward op on (p, the first Nv snapshots), with the fold
# pseudo_query = norm_weight * proj_weight.
READS = [
    pytest.param(12, 4, 4, 64, id="T12-N4-Nv4-D64"),
    pytest.param(12, 6, 2, 64, id="T12-N6-Nv2-D64"),
    pytest.param(5, 3, 1, 7, id="T5-N3-Nv1-D7"),
    pytest.param(4, 8, 8, 2048, id="T4-N8-Nv8-D2048"),
]


@pytest.mark.parametrize(("tokens", "blocks", "valid", "hidden"), READS)
def test_a_read_through_prepare_and_update_equals_the_forward_op(tokens, blocks, valid, hidden):
    _, block_res, proj_weight, norm_weight = make_inputs(tokens, blocks, hidden, seed=3)
    generator = torch.Generator().manual_seed(4)
    partial = torch.randn(tokens, hidden, generator=generator)
    delta = torch.randn(tokens, hidden, generator=generator)
    pseudo_query = norm_weight * proj_weight.reshape(-1)  # the fold, a float32 product
    readers = torch.stack([pseudo_query, torch.randn(hidden, generator=generator)])  # S = 2: slot 0 is ours
    numerator, logit_max, exp_sum = prepare_op(block_res, count(valid), readers)
    updated = partial.clone()
    h = update_op(updated, delta, pseudo_query, numerator[0], logit_max[0], exp_sum[0])
    expected, _, _ = forward_op(updated, block_res[:, :valid].contiguous(), proj_weight, norm_weight)
    torch.testing.assert_close(h, expected, rtol=TOLERANCES[torch.float32][0], atol=TOLERANCES[torch.float32][1])


# ------------------------------------------------------------------------------------------ in place


def test_update_writes_into_a_non_contiguous_partial_block():
    partial, delta, query, *state = update_inputs(6, 10, torch.float32, None)
    storage = partial.t().contiguous()  # [D, T]
    view = storage.t()  # [T, D], not contiguous
    expected = (view + delta).contiguous()
    h = update_op(view, delta, query, *state)
    assert not view.is_contiguous()
    assert_bitwise_equal("partial_block", view.contiguous(), expected)
    assert_bitwise_equal("h", h, expected)


def test_update_accepts_views_of_one_storage_that_do_not_overlap():
    partial, delta, query, numerator, logit_max, exp_sum = update_inputs(5, 8, torch.float32, None)
    buffer = torch.stack([partial, numerator])  # partial_block and numerator in one storage, side by side
    update_op(buffer[0], delta, query, buffer[1], logit_max, exp_sum)
    assert_bitwise_equal("partial_block", buffer[0], partial + delta)
    assert_bitwise_equal("numerator", buffer[1], numerator)


def test_update_bumps_the_version_of_partial_block():
    partial, *rest = update_inputs(3, 8, torch.float32, None)
    version = partial._version
    update_op(partial, *rest)
    assert partial._version > version


# ------------------------------------------------------------------------------------------ validation

T, N, S, D = 4, 3, 2, 8


def prepare_args(**changes):
    block_res, pseudo_query = prepare_inputs(T, N, S, D)
    args = {"block_res": block_res, "valid_blocks": count(2), "pseudo_query": pseudo_query, "eps": 1e-6}
    args.update(changes)
    return args


def update_args(**changes):
    partial, delta, query, numerator, logit_max, exp_sum = update_inputs(T, D, torch.bfloat16, None)
    args = {"partial_block": partial, "delta": delta, "pseudo_query": query, "numerator": numerator,
            "logit_max": logit_max, "exp_sum": exp_sum, "eps": 1e-6}
    args.update(changes)
    return args


EPS_CASES = [(0.0, "got 0.0"), (-1e-6, "got -1e-06"), (float("inf"), "got inf"), (float("nan"), "got nan"),
             (1e-50, "got 1e-50 (0.0 as float32)")]
EPS_RULE = "attribute eps must be finite and > 0 as a float32 (how GE stores it)"

PREPARE_CASES = [
    ("block_res-float16", dict(block_res=torch.ones(T, N, D, dtype=torch.float16)),
     "block_res must have dtype in (torch.float32), got torch.float16"),
    ("valid_blocks-int64", dict(valid_blocks=torch.tensor([2])),
     "valid_blocks must have dtype in (torch.uint64), got torch.int64"),
    ("valid_blocks-shape2", dict(valid_blocks=torch.tensor([2, 2], dtype=torch.uint64)),
     "valid_blocks must have shape [1] = [1], got [2]"),
    ("valid_blocks-scalar", dict(valid_blocks=torch.tensor(2, dtype=torch.uint64)),
     "valid_blocks must be 1-D [1] = [1], got shape []"),
    ("pseudo_query-float16", dict(pseudo_query=torch.ones(S, D, dtype=torch.float16)),
     "pseudo_query must have dtype in (torch.float32), got torch.float16"),
    ("block_res-2d", dict(block_res=torch.ones(T, D)), "block_res must be 3-D [T, N, D] = [*, *, *], got shape [4, 8]"),
    ("N0", dict(block_res=torch.ones(T, 0, D)), "block_res must have 1 <= N <= 64 (sealed snapshots), got N = 0"),
    ("N65", dict(block_res=torch.ones(T, 65, D)), "block_res must have 1 <= N <= 64 (sealed snapshots), got N = 65"),
    ("D0", dict(block_res=torch.ones(T, N, 0), pseudo_query=torch.ones(S, 0)),
     "block_res must have 1 <= D <= 8192 (hidden size), got D = 0"),
    ("D8193", dict(block_res=torch.ones(1, N, 8193), pseudo_query=torch.ones(S, 8193)),
     "block_res must have 1 <= D <= 8192 (hidden size), got D = 8193"),
    ("pseudo_query-D", dict(pseudo_query=torch.ones(S, D + 1)),
     "pseudo_query must have shape [S, D] = [*, 8], got [2, 9]"),
    ("pseudo_query-1d", dict(pseudo_query=torch.ones(D)), "pseudo_query must be 2-D [S, D] = [*, 8], got shape [8]"),
    *[(f"eps-{value}", dict(eps=value), f"{EPS_RULE}, got") for value, _ in EPS_CASES],
    ("device-mismatch", dict(valid_blocks=torch.ones(1, dtype=torch.uint64, device="meta")),
     "all tensors must be on one device"),
]

UPDATE_CASES = [
    ("partial_block-bfloat16", dict(partial_block=torch.ones(T, D, dtype=torch.bfloat16)),
     "partial_block must have dtype in (torch.float32), got torch.bfloat16"),
    ("delta-float64", dict(delta=torch.ones(T, D, dtype=torch.float64)),
     "delta must have dtype in (torch.float16, torch.bfloat16, torch.float32), got torch.float64"),
    ("numerator-bfloat16", dict(numerator=torch.ones(T, D, dtype=torch.bfloat16)),
     "numerator must have dtype in (torch.float32), got torch.bfloat16"),
    ("logit_max-float16", dict(logit_max=torch.ones(T, dtype=torch.float16)),
     "logit_max must have dtype in (torch.float32), got torch.float16"),
    ("exp_sum-float16", dict(exp_sum=torch.ones(T, dtype=torch.float16)),
     "exp_sum must have dtype in (torch.float32), got torch.float16"),
    ("pseudo_query-bfloat16", dict(pseudo_query=torch.ones(D, dtype=torch.bfloat16)),
     "pseudo_query must have dtype in (torch.float32), got torch.bfloat16"),
    ("partial_block-3d", dict(partial_block=torch.ones(T, 1, D)),
     "partial_block must be 2-D [T, D] = [*, *], got shape [4, 1, 8]"),
    ("D8193", dict(partial_block=torch.ones(1, 8193)), "partial_block must have 0 <= D <= 8192 (hidden size), got "
     "D = 8193"),
    ("delta-T", dict(delta=torch.ones(T + 1, D, dtype=torch.bfloat16)),
     "delta must have shape [T, D] = [4, 8], got [5, 8]"),
    ("numerator-D", dict(numerator=torch.ones(T, D - 1)), "numerator must have shape [T, D] = [4, 8], got [4, 7]"),
    ("pseudo_query-2d", dict(pseudo_query=torch.ones(1, D)), "pseudo_query must be 1-D [D] = [8], got shape [1, 8]"),
    ("logit_max-T", dict(logit_max=torch.ones(T + 1)), "logit_max must have shape [T] = [4], got [5]"),
    ("exp_sum-2d", dict(exp_sum=torch.ones(T, 1)), "exp_sum must be 1-D [T] = [4], got shape [4, 1]"),
    *[(f"eps-{value}", dict(eps=value), f"{EPS_RULE}, got") for value, _ in EPS_CASES],
]


def call_prepare(args):
    return prepare_op(args["block_res"], args["valid_blocks"], args["pseudo_query"], eps=args["eps"])


def call_update(args):
    tensors = [args[name] for name in ("partial_block", "delta", "pseudo_query", "numerator", "logit_max", "exp_sum")]
    return update_op(*tensors, eps=args["eps"])


def expect_error(call, args, message, where, exception=AttnResInputError):
    with pytest.raises(exception) as caught:
        call(args)
    text = str(caught.value)
    assert message in text, f"message {message!r} not in {text!r}"
    assert re.search(rf"BlockAttnRes(Prepare|Update) \({re.escape(where)}\)", text), text


def where_of(args, default):
    """A meta tensor sends even an eager call to the fake/meta kernel."""
    meta = any(isinstance(v, torch.Tensor) and v.device.type == "meta" for v in args.values())
    return WHERE_FAKE if meta else default


def on_fake_tensors(args):
    """The same arguments as fake tensors: the op then runs its fake implementation."""
    mode = FakeTensorMode()
    return mode, {name: mode.from_tensor(v) if isinstance(v, torch.Tensor) else v for name, v in args.items()}


@pytest.mark.parametrize(("changes", "message"), [pytest.param(c, m, id=i) for i, c, m in PREPARE_CASES])
def test_prepare_rejects_at_eager_call(changes, message):
    args = prepare_args(**changes)
    expect_error(call_prepare, args, message, where_of(args, WHERE_EAGER))


@pytest.mark.parametrize(("changes", "message"), [pytest.param(c, m, id=i) for i, c, m in PREPARE_CASES])
def test_prepare_rejects_in_its_fake_implementation(changes, message):
    mode, args = on_fake_tensors(prepare_args(**changes))
    with mode:
        expect_error(call_prepare, args, message, WHERE_FAKE)


@pytest.mark.parametrize(("changes", "message"), [pytest.param(c, m, id=i) for i, c, m in UPDATE_CASES])
def test_update_rejects_at_eager_call(changes, message):
    args = update_args(**changes)
    before = args["partial_block"].clone()
    expect_error(call_update, args, message, WHERE_EAGER)
    assert torch.equal(args["partial_block"], before), "a rejected call must leave partial_block as it was"


@pytest.mark.parametrize(("changes", "message"), [pytest.param(c, m, id=i) for i, c, m in UPDATE_CASES])
def test_update_rejects_in_its_fake_implementation(changes, message):
    mode, args = on_fake_tensors(update_args(**changes))
    with mode:
        expect_error(call_update, args, message, WHERE_FAKE)


def test_update_rejects_a_device_mismatch():
    args = update_args(exp_sum=torch.ones(T, device="meta"))
    expect_error(call_update, args, "all tensors must be on one device", WHERE_FAKE)


@pytest.mark.parametrize("call", [call_prepare, call_update], ids=["prepare", "update"])
def test_a_rejection_is_the_same_under_torch_compile(call):
    args = prepare_args(block_res=torch.ones(T, 65, D)) if call is call_prepare else update_args(
        logit_max=torch.ones(T + 1))
    message = "got N = 65" if call is call_prepare else "logit_max must have shape [T] = [4], got [5]"
    compiled = torch.compile(call, backend="eager", fullgraph=True)
    expect_error(compiled, args, message, WHERE_FAKE, (AttnResInputError, torch._dynamo.exc.TorchRuntimeError))


def aliasing_cases():
    partial = torch.randn(T, D)
    return [
        pytest.param(dict(partial_block=partial, numerator=partial), "numerator", id="numerator-is-partial_block"),
        pytest.param(dict(partial_block=partial, delta=partial), "delta", id="float32-delta-is-partial_block"),
        pytest.param(dict(partial_block=partial, pseudo_query=partial[1]), "pseudo_query",
                     id="pseudo_query-is-a-row-of-partial_block"),
        pytest.param(dict(partial_block=partial, logit_max=partial[:, 0]), "logit_max",
                     id="logit_max-is-a-column-of-partial_block"),
    ]


@pytest.mark.parametrize(("changes", "other"), aliasing_cases())
def test_update_rejects_partial_block_sharing_memory_with_another_argument(changes, other):
    message = f"partial_block is updated in place and must not share memory with {other}"
    args = update_args(**changes)
    before = args["partial_block"].clone()
    expect_error(call_update, args, message, WHERE_EAGER)
    assert torch.equal(args["partial_block"], before)
    mode, fake_args = on_fake_tensors(args)
    with mode:
        expect_error(call_update, fake_args, message, WHERE_FAKE)


def test_a_non_tensor_where_a_tensor_belongs_is_named():
    # torch's schema check answers first, naming the argument.
    with pytest.raises(RuntimeError, match="Expected a value of type 'Tensor' for argument 'valid_blocks'"):
        call_prepare(prepare_args(valid_blocks=2))


# ------------------------------------------------------------------------------------------ torch.library


def opcheck_prepare_samples():
    block_res, pseudo_query = prepare_inputs(5, 4, 3, 24)
    transposed = block_res.transpose(0, 1).contiguous().transpose(0, 1)  # [T, N, D], not contiguous
    offset = torch.randn(2 * 3 * 24 + 5)[5:].view(2, 3, 24)  # a view at a storage offset
    return [
        pytest.param((block_res, count(3), pseudo_query), {"eps": 1e-5}, id="T5-N4-S3-Nv3"),
        pytest.param((block_res, count(0), pseudo_query), {}, id="empty-state"),
        pytest.param((block_res[:0], count(2), pseudo_query), {}, id="T0"),
        pytest.param((block_res, count(2), pseudo_query[:0]), {}, id="S0"),
        pytest.param((transposed, count(4), pseudo_query.t().contiguous().t()), {}, id="transposed"),
        pytest.param((offset, count(3), pseudo_query[:2]), {}, id="offset"),
        pytest.param((block_res.clone().requires_grad_(), count(3), pseudo_query.clone().requires_grad_()), {},
                     id="requires-grad"),
    ]


@pytest.mark.parametrize(("args", "kwargs"), opcheck_prepare_samples())
def test_opcheck_prepare(args, kwargs):
    torch.library.opcheck(prepare_op, args, kwargs)


def opcheck_update_samples():
    block_res, queries = prepare_inputs(6, 3, 1, 16)
    state = [t.detach() for t in prepare_op(block_res, count(2), queries)]
    samples = []
    for dtype in DTYPE_IDS:
        inputs = update_inputs(6, 16, dtype, state)
        samples.append(pytest.param(inputs, {"eps": 1e-5}, id=f"T6-D16-{DTYPE_IDS[dtype]}"))
    partial, delta, query, numerator, logit_max, exp_sum = update_inputs(6, 16, torch.bfloat16, state)
    samples.append(pytest.param((partial.t().contiguous().t(), delta.t().contiguous().t(), query,
                                 numerator.t().contiguous().t(), logit_max, exp_sum), {}, id="transposed"))
    samples.append(pytest.param(update_inputs(0, 16, torch.bfloat16, None), {}, id="T0"))
    samples.append(pytest.param(update_inputs(3, 0, torch.float32, None), {}, id="D0"))
    return samples


@pytest.mark.parametrize(("args", "kwargs"), opcheck_update_samples())
def test_opcheck_update(args, kwargs):
    torch.library.opcheck(update_op, args, kwargs)


# ------------------------------------------------------------------------------------------ gradients


def prepare_loss_weights(outputs, seed=9):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(output.shape, generator=generator, dtype=output.dtype) for output in outputs]


@pytest.mark.parametrize("valid", [pytest.param(v, id=f"valid{v}") for v in (0, 2, 4, 7)])
def test_prepare_gradients_match_the_float64_reference(valid):
    """The op's backward (float32 inputs) against autograd through the float64 reference from the same
    inputs, every output weighted; snapshots past Nv get exactly zero gradient."""
    block_res, pseudo_query = prepare_inputs(5, 4, 3, 24, seed=11)
    leaves = [block_res.clone().requires_grad_(), pseudo_query.clone().requires_grad_()]
    outputs = prepare_op(leaves[0], count(valid), leaves[1])
    weights = prepare_loss_weights(outputs)
    sum((w * o).sum() for w, o in zip(weights, outputs, strict=True)).backward()
    exact = [t.double().requires_grad_() for t in (block_res, pseudo_query)]
    reference = block_attn_res_prepare_reference(exact[0], count(valid), exact[1])
    loss = sum((w.double() * o).sum() for w, o in zip(weights, reference, strict=True))
    if loss.requires_grad:
        loss.backward()
    for name, leaf, oracle in zip(("block_res", "pseudo_query"), leaves, exact, strict=True):
        expected = torch.zeros_like(oracle) if oracle.grad is None else oracle.grad
        assert_within(f"grad {name}", leaf.grad, expected, torch.float32)
    assert torch.equal(leaves[0].grad[:, min(valid, 4):], torch.zeros_like(leaves[0].grad[:, min(valid, 4):]))


def test_gradcheck_prepare():
    """gradcheck's float64 leaves pass through the float32 op (the op accepts no float64), so the
    finite-difference step and tolerances are sized for float32 rounding (as tests/test_numerics.py)."""
    block_res, pseudo_query = prepare_inputs(3, 3, 2, 6, seed=5)
    leaves = [block_res.double().requires_grad_(), pseudo_query.double().requires_grad_()]

    def fn(rows, queries):
        return tuple(out.double() for out in prepare_op(rows.float(), count(2), queries.float()))

    assert torch.autograd.gradcheck(fn, leaves, eps=1e-3, atol=2e-3, rtol=2e-2, nondet_tol=0.0)


def test_update_refuses_a_call_that_would_need_its_gradient():
    partial, delta, query, *state = update_inputs(3, 8, torch.float32, None)
    delta.requires_grad_()
    before = partial.clone()
    with pytest.raises(AttnResInputError, match=r"BlockAttnResUpdate .*inference-only .*delta requires grad"):
        update_op(partial, delta, query, *state)
    assert torch.equal(partial, before)
    with torch.no_grad():
        h = update_op(partial, delta, query, *state)
    assert not h.requires_grad
    assert_bitwise_equal("h", h, before + delta.detach())


# ------------------------------------------------------------------------------------------ determinism


def run_both(threads):
    """Prepare then update at `threads` torch threads, on shapes that split cores, loops and tiles."""
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        block_res, queries = prepare_inputs(37, 6, 3, 300, seed=13)
        state = prepare_op(block_res, count(5), queries)
        partial, delta, query, *slot = update_inputs(37, 300, torch.bfloat16, state)
        h = update_op(partial, delta, query, *slot)
        return (*state, partial, h)
    finally:
        torch.set_num_threads(saved)


def test_the_same_bits_with_one_and_two_threads():
    for index, (one, two) in enumerate(zip(run_both(1), run_both(2), strict=True)):
        assert_bitwise_equal(f"output {index}", one, two)


def run_kernel(kernel, platform, tensors, attrs):
    runtime = HostRuntime(platform)
    plan = runtime.plan(kernel, tensors, attrs, WHERE_EAGER)
    outputs = tuple(torch.empty(meta.shape, dtype=meta.dtype) for meta in plan.outputs)
    runtime.run_kernel(plan, [t.contiguous() for t in tensors], outputs)
    return plan.tiling, outputs


def test_the_same_bits_for_every_tiling():
    """Core counts, token loops, query groups and hidden tiles change the walk, never a bit of the results."""
    block_res, queries = prepare_inputs(29, 7, 6, 520, seed=17)
    prepare_tensors = (block_res, count(6), queries)
    platforms = [host(1, 2048 * KIB), host(3, 64 * KIB), host(16, 8 * KIB), host(64, 1 * KIB)]
    tilings, results = [], []
    for profile in platforms:
        tiling, outputs = run_kernel(PREPARE_KERNEL, PlatformInfo(profile), prepare_tensors, {})
        tilings.append(tiling)
        results.append(outputs)
    modes = {(t.data.used_core_num, t.data.tokens_per_loop, t.data.query_tile, t.data.h_tile_num) for t in tilings}
    assert len(modes) == len(platforms), f"the platforms must give distinct walks: {modes}"
    assert any(t.data.h_tile_num > 1 for t in tilings) and any(t.data.query_tile < 6 for t in tilings)
    for tiling, outputs in zip(tilings[1:], results[1:], strict=True):
        for index, (actual, expected) in enumerate(zip(outputs, results[0], strict=True)):
            assert_bitwise_equal(f"prepare output {index} with\n{tiling.describe()}", actual, expected)

    update_tensors = update_inputs(29, 520, torch.float16, results[0])
    update_results = [run_kernel(UPDATE_KERNEL, PlatformInfo(profile), update_tensors, {}) for profile in platforms]
    assert any(tiling.data.h_tile_num > 1 for tiling, _ in update_results)
    for tiling, outputs in update_results[1:]:
        for index, (actual, expected) in enumerate(zip(outputs, update_results[0][1], strict=True)):
            assert_bitwise_equal(f"update output {index} with\n{tiling.describe()}", actual, expected)


@pytest.mark.parametrize("profile", HOST_SAMPLE)
def test_prepare_reads_valid_blocks_when_it_runs(profile):
    """One plan serves every count: the count is read at run time, so changing it in place changes the result."""
    block_res, queries = prepare_inputs(6, 5, 2, 24)
    valid = count(2)
    runtime = HostRuntime(PlatformInfo(profile))
    results = []
    for value in (2, 5, 0):
        valid.fill_(value)
        plan = runtime.plan(PREPARE_KERNEL, (block_res, valid, queries), {}, WHERE_EAGER)
        outputs = tuple(torch.empty(meta.shape, dtype=meta.dtype) for meta in plan.outputs)
        runtime.run_kernel(plan, (block_res, valid, queries), outputs)
        results.append((plan, outputs))
        for name, actual, expected in zip(("numerator", "logit_max", "exp_sum"), outputs,
                                          block_attn_res_prepare_reference(block_res, valid, queries), strict=True):
            assert_within(f"{name} at valid_blocks={value}", actual, expected, torch.float32)
    assert results[0][0] is results[1][0] is results[2][0], "a new count must not make a new plan"


def test_update_in_place_with_hidden_tiles_reads_p_back_not_partial_plus_delta_again():
    """With the hidden dimension tiled, h is computed in a second pass; in place, partial_block already
    holds p by then, so adding delta again would be wrong."""
    from conftest import process_runtime_on

    block_res, queries = prepare_inputs(9, 3, 1, 600, seed=21)
    state = prepare_op(block_res, count(3), queries)
    inputs = update_inputs(9, 600, torch.float32, state)
    expected_partial, expected_h = block_attn_res_update_reference(*inputs)
    with process_runtime_on(host(2, 1 * KIB)) as runtime:
        h = update_op(*inputs)
        plan = runtime.plan(UPDATE_KERNEL, inputs, {}, WHERE_EAGER)
    assert plan.tiling.data.h_tile_num > 1, plan.tiling.describe()
    assert_within("partial_block", inputs[0], expected_partial, torch.float32)
    assert_within("h", h, expected_h, torch.float32)


# ------------------------------------------------------------------------------------------ prototypes


def test_the_opdef_dtypes_are_canns_and_the_cpu_accepts_more_delta_dtypes():
    from attnres_ge.op_proto import PREPARE, UPDATE

    declared = {arg.name: arg.dtypes for arg in (*UPDATE.inputs, *UPDATE.outputs)}
    assert declared["delta"] == declared["h"] == (torch.bfloat16,)
    assert all(declared[name] == (torch.float32,) for name in ("partial_block", "pseudo_query", "numerator"))
    assert [arg.accepted_dtypes for arg in UPDATE.inputs if arg.name == "delta"] == [
        (torch.float16, torch.bfloat16, torch.float32)]
    assert [arg.dtypes for arg in PREPARE.inputs] == [(torch.float32,), (torch.uint64,), (torch.float32,)]
    assert [(a.name, a.kind, a.default) for proto in (PREPARE, UPDATE) for a in proto.attrs] == [
        ("eps", "Float", 1e-6), ("eps", "Float", 1e-6)]


def test_update_declares_partial_block_as_a_reference_output_in_its_reg_op():
    from attnres_ge.op_proto import PREPARE, UPDATE
    from attnres_ge.op_proto.export import reg_op

    assert UPDATE.reference_outputs() == ["partial_block"] and PREPARE.reference_outputs() == []
    block = reg_op(UPDATE)
    assert ".INPUT(partial_block, TensorType({DT_FLOAT}))" in block
    assert ".OUTPUT(partial_block, TensorType({DT_FLOAT}))" in block
    assert ".OUTPUT(h, TensorType({DT_BF16}))" in block
    assert ".INPUT(valid_blocks, TensorType({DT_UINT64}))" in reg_op(PREPARE)


def metas(**shapes_and_dtypes):
    from attnres_ge.op_proto import TensorMeta

    return {name: TensorMeta(shape, dtype) for name, (shape, dtype) in shapes_and_dtypes.items()}


def test_infer_shape_keeps_unknown_dims_and_accepts_unknown_rank():
    from attnres_ge.op_proto import PREPARE, UPDATE, WHERE_GRAPH

    f32, u64 = torch.float32, torch.uint64
    prepared = PREPARE.infer(metas(block_res=((-1, 4, 16), f32), valid_blocks=((-2,), u64),
                                   pseudo_query=((3, -1), f32)), {}, WHERE_GRAPH)
    assert [m.shape for m in prepared] == [(3, -1, 16), (3, -1), (3, -1)]
    unknown_rank = PREPARE.infer(metas(block_res=((-2,), f32), valid_blocks=((1,), u64),
                                       pseudo_query=((2, 8), f32)), {}, WHERE_GRAPH)
    assert [m.shape for m in unknown_rank] == [(2, -1, -1), (2, -1), (2, -1)]
    updated = UPDATE.infer(metas(partial_block=((-1, 32), f32), delta=((-1, 32), torch.float16),
                                 pseudo_query=((-2,), f32), numerator=((-1, -1), f32), logit_max=((-1,), f32),
                                 exp_sum=((-2,), f32)), {}, WHERE_GRAPH)
    assert [(m.shape, m.dtype) for m in updated] == [((-1, 32), f32), ((-1, 32), torch.float16)]
    with pytest.raises(AttnResInputError, match=r"BlockAttnResUpdate \(graph build, InferShape\): delta must have "
                                                r"shape \[T, D\] = \[-1, 32\], got \[-1, 31\]"):
        UPDATE.infer(metas(partial_block=((-1, 32), f32), delta=((-1, 31), f32), pseudo_query=((32,), f32),
                           numerator=((-1, 32), f32), logit_max=((-1,), f32), exp_sum=((-1,), f32)), {}, WHERE_GRAPH)


# ------------------------------------------------------------------------------------------ NPU dispatch


def test_npu_dispatch_forwards_both_ops_to_canns_ops_of_the_same_name(monkeypatch):
    """With torch_npu and cann_ops_transformer loaded, each op's NPU kernel is CANN's op of the same name,
    called with the arguments unchanged (stand-ins here: no NPU device exists on this machine)."""
    import sys
    from types import ModuleType, SimpleNamespace

    from attnres_ge.ge_plugin import npu

    def standin(name):
        return lambda *args, **kwargs: (name, args, kwargs)

    cann = SimpleNamespace(block_attn_res_prepare=standin("prepare"), block_attn_res_update=standin("update"))
    registered = {}
    monkeypatch.setitem(sys.modules, "torch_npu", ModuleType("torch_npu"))
    monkeypatch.setitem(sys.modules, "cann_ops_transformer", ModuleType("cann_ops_transformer"))
    monkeypatch.setattr(torch.ops, "cann_ops_transformer", cann, raising=False)
    monkeypatch.setattr(torch.library, "register_kernel",
                        lambda name, device, kernel: registered.setdefault(name, (device, kernel)))
    monkeypatch.setattr(npu, "_warmed_devices", {torch.device("cpu")})  # no warm-up op in this test
    assert npu.register_npu_kernels()
    # the update with a fused norm runs CANN's update, then the norm (tests/test_npu_dispatch.py)
    assert set(registered) == {"attnres::block_attn_res_prepare", "attnres::block_attn_res_update",
                               "attnres::block_attn_res_update_norm"}
    assert registered["attnres::block_attn_res_update_norm"][0] == "npu"
    block_res, queries = prepare_inputs(3, 2, 1, 8)
    valid = count(2)
    device, kernel = registered["attnres::block_attn_res_prepare"]
    name, args, kwargs = kernel(block_res, valid, queries, eps=1e-5)
    assert device == "npu" and name == "prepare" and kwargs == {"eps": 1e-5}
    assert all(got is given for got, given in zip(args, (block_res, valid, queries), strict=True))
    inputs = update_inputs(3, 8, torch.bfloat16, None)
    device, kernel = registered["attnres::block_attn_res_update"]
    name, args, _ = kernel(*inputs)
    assert device == "npu" and name == "update"
    assert all(got is given for got, given in zip(args, inputs, strict=True))
