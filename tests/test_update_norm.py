"""BlockAttnResUpdateNorm: the two-phase update with a fused output RMSNorm (op_proto/block_attn_res_update_norm.py).

Against the float64 reference (the update's, then the norm), against the update op it extends (partial_block the
same bits), on every kernel path, in place, its refusals, and as a local GE node."""

from __future__ import annotations

import pytest
import torch
from conftest import assert_bitwise_equal
from test_two_phase_ops import DTYPE_IDS, UPDATE_SHAPES, assert_within, count, prepare_inputs, update_inputs

import attnres_ge
from attnres_ge.op_kernel import KERNELS, native_available
from attnres_ge.op_kernel.reference import block_attn_res_update_reference
from attnres_ge.op_proto import AttnResInputError

update_norm_op = torch.ops.attnres.block_attn_res_update_norm
update_op = torch.ops.attnres.block_attn_res_update
prepare_op = torch.ops.attnres.block_attn_res_prepare


def normed_inputs(tokens, hidden, delta_dtype, prepared=True, seed=3):
    """The update's inputs (one prepared slot, or the empty state) and an output-norm weight [D]."""
    state = None
    if prepared:
        block_res, queries = prepare_inputs(tokens, 4, 1, max(hidden, 1))
        state = prepare_op(block_res[..., :hidden].contiguous(), count(3), queries[:, :hidden].contiguous())
    weight = 1 + 0.5 * torch.randn(hidden, generator=torch.Generator().manual_seed(seed))
    return (*update_inputs(tokens, hidden, delta_dtype, state), weight)


def reference(inputs, eps=1e-6, output_eps=1e-6):
    """(partial_block, normed h) in float64 from the same (rounded) inputs."""
    *update_args, weight = inputs
    partial, h = block_attn_res_update_reference(*update_args, eps)
    inv_rms = torch.rsqrt(h.pow(2).mean(dim=-1, keepdim=True) + output_eps)
    return partial, h * inv_rms * weight.double()


def clones(inputs):
    return [tensor.clone() for tensor in inputs]


@pytest.mark.parametrize("implementation", ["native", "python"])
@pytest.mark.parametrize("delta_dtype", [pytest.param(d, id=i) for d, i in DTYPE_IDS.items()])
@pytest.mark.parametrize(("tokens", "hidden", "prepared"), UPDATE_SHAPES)
def test_matches_the_float64_reference(tokens, hidden, prepared, delta_dtype, implementation):
    if implementation == "native" and not native_available():
        pytest.skip("the native kernels are not built")
    if implementation == "python" and tokens * hidden > 50_000:
        pytest.skip("the Python kernel's float64 loop is slow at this size; the native one covers it")
    inputs = normed_inputs(tokens, hidden, delta_dtype, prepared)
    expected_partial, expected_h = reference(inputs)
    before = KERNELS.implementation
    KERNELS.set_implementation(implementation)
    try:
        h = update_norm_op(*inputs)
    finally:
        KERNELS.set_implementation(before)
    assert h.dtype == delta_dtype and h.shape == (tokens, hidden)
    assert_within("partial_block", inputs[0], expected_partial, torch.float32)
    assert_within("h", h, expected_h, delta_dtype)


@pytest.mark.parametrize("delta_dtype", [pytest.param(d, id=i) for d, i in DTYPE_IDS.items()])
def test_partial_block_is_the_updates_and_h_its_normed_read(delta_dtype):
    inputs = normed_inputs(9, 300, delta_dtype)
    fused_inputs, plain_inputs = clones(inputs), clones(inputs)
    h = update_norm_op(*fused_inputs, eps=1e-5, output_eps=1e-3)
    plain_h = update_op(*plain_inputs[:6], eps=1e-5)
    assert_bitwise_equal("partial_block", fused_inputs[0], plain_inputs[0])
    # the unfused pair rounds h to delta's dtype before the norm; the fused op does not
    expected = torch.nn.functional.rms_norm(plain_h.double(), (300,), inputs[6].double(), 1e-3)
    assert_within("h", h, expected, delta_dtype)


def test_every_isa_path_and_thread_count_gives_the_same_bits(restore_isa_path):
    if not native_available():
        pytest.skip("the native kernels are not built")
    from attnres_ge.op_kernel import native

    results = {}
    for dtype in DTYPE_IDS:
        inputs = normed_inputs(13, 1000, dtype)  # 62 full groups and a partial one
        for path in native.available_isa_paths():
            native.use_isa_path(path)
            for threads in (1, 2):
                before = torch.get_num_threads()
                torch.set_num_threads(threads)
                try:
                    run = clones(inputs)
                    h = update_norm_op(*run)
                finally:
                    torch.set_num_threads(before)
                first = results.setdefault(dtype, (path, threads, run[0], h))
                assert_bitwise_equal(f"partial_block {dtype} {path}/{threads} vs {first[:2]}", run[0], first[2])
                assert_bitwise_equal(f"h {dtype} {path}/{threads} vs {first[:2]}", h, first[3])


def test_writes_into_a_non_contiguous_partial_block_and_bumps_its_version():
    inputs = normed_inputs(6, 10, torch.float32)
    view = inputs[0].t().contiguous().t()  # [T, D], not contiguous
    expected_partial = (view + inputs[1]).contiguous()
    expected_h = update_norm_op(*clones(inputs))
    version = view._version
    h = update_norm_op(view, *inputs[1:])
    assert not view.is_contiguous() and view._version > version
    assert_bitwise_equal("partial_block", view.contiguous(), expected_partial)
    assert_bitwise_equal("h", h, expected_h)


def test_weight_of_any_float_dtype_is_used_as_float32():
    inputs = normed_inputs(5, 24, torch.bfloat16)
    weight = inputs[6].to(torch.bfloat16)
    as_bf16 = update_norm_op(*clones(inputs[:6]), weight)
    as_f32 = update_norm_op(*clones(inputs[:6]), weight.float())
    assert_bitwise_equal("h", as_bf16, as_f32)


ERROR_CASES = [
    ("weight-shape", dict(output_norm_weight=torch.ones(9)),
     "output_norm_weight must have shape [D] = [8], got [9]"),
    ("weight-dtype", dict(output_norm_weight=torch.ones(8, dtype=torch.float64)),
     "output_norm_weight must have dtype in"),
    ("output_eps-0", dict(output_eps=0.0), "attribute output_eps must be finite and > 0 as a float32"),
    ("delta-float64", dict(delta=torch.ones(4, 8, dtype=torch.float64)), "delta must have dtype in"),
    ("numerator-D", dict(numerator=torch.ones(4, 7)), "numerator must have shape [T, D] = [4, 8], got [4, 7]"),
]


@pytest.mark.parametrize(("changes", "message"), [pytest.param(c, m, id=i) for i, c, m in ERROR_CASES])
def test_rejects_bad_input_naming_the_op(changes, message):
    names = ("partial_block", "delta", "pseudo_query", "numerator", "logit_max", "exp_sum", "output_norm_weight")
    args = dict(zip(names, normed_inputs(4, 8, torch.float32, prepared=False), strict=True))
    attrs = {"eps": 1e-6, "output_eps": 1e-6}
    for name, value in changes.items():
        (attrs if name in attrs else args)[name] = value
    with pytest.raises(AttnResInputError, match="BlockAttnResUpdateNorm") as error:
        update_norm_op(*args.values(), **attrs)
    assert message in str(error.value)


def test_rejects_partial_block_sharing_memory_with_delta():
    partial, _, *rest = normed_inputs(4, 8, torch.float32, prepared=False)
    with pytest.raises(AttnResInputError, match="partial_block is updated in place and must not share memory"):
        update_norm_op(partial, partial, *rest)


def test_refuses_a_call_that_would_need_a_gradient():
    inputs = normed_inputs(4, 8, torch.float32, prepared=False)
    inputs[6].requires_grad_(True)
    with pytest.raises(AttnResInputError, match="inference-only .* output_norm_weight requires grad"):
        update_norm_op(*inputs)
    with torch.no_grad():
        update_norm_op(*inputs)


def test_a_local_ge_node_equals_eager_bit_for_bit():
    def step(*tensors):
        return update_norm_op(*tensors, eps=1e-5, output_eps=1e-4)

    inputs = normed_inputs(7, 40, torch.bfloat16)
    eager_inputs, graph_inputs = clones(inputs), clones(inputs)
    backend = attnres_ge.ge_backend()
    with torch.no_grad():
        expected = step(*eager_inputs)
        h = torch.compile(step, backend=backend, fullgraph=True)(*graph_inputs)
    assert_bitwise_equal("h", h, expected)
    assert_bitwise_equal("partial_block", graph_inputs[0], eager_inputs[0])
    [graph] = backend.graphs
    assert [op.type for op in graph.op] == ["Data"] * 7 + ["BlockAttnResUpdateNorm", "NetOutput"]
