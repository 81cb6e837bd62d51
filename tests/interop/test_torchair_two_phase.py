"""The two-phase ops through the real torchair: the BlockAttnResPrepare and BlockAttnResUpdate nodes our
converters emit (types, input/output names and order, eps), update's reference output (torchair finds the
new partial_block as the node's output named like its input and assigns it the caller's tensor), runs on
the local GE bit for bit with eager (the caller's partial_block included), one graph for every
valid_blocks value, and the converter torchair generates from our prototypes against ours."""

from __future__ import annotations

import pytest
import torch
import torchair
from interop_helpers import (
    TORCH_TO_PROTO_DTYPE,
    assert_bitwise_equal,
    assert_node_matches_prototype,
    attr_values,
    capture,
    compile_and_capture,
    node_signature,
    npu_compile,
    only_op,
    output_dtypes,
)
from torchair._ge_concrete_graph.fx2ge_converter import _get_converter
from torchair._ge_concrete_graph.ge_ir_pb2 import DataType as ProtoDataType

from attnres_ge.ge_plugin.ops import BLOCK_ATTN_RES_PREPARE, BLOCK_ATTN_RES_UPDATE
from attnres_ge.op_proto import PREPARE, UPDATE

PREPARE_SCHEMA = BLOCK_ATTN_RES_PREPARE.schema()
UPDATE_SCHEMA = BLOCK_ATTN_RES_UPDATE.schema()

T, N, S, D = 5, 3, 2, 8
EPS = 1e-5
F32, BF16 = TORCH_TO_PROTO_DTYPE[torch.float32], TORCH_TO_PROTO_DTYPE[torch.bfloat16]
U64 = ProtoDataType.Value("DT_UINT64")
ATTNRES = torch.ops.attnres


def prepare_inputs(device, valid=2, seed=0, tokens=T):
    generator = torch.Generator().manual_seed(seed)
    block_res = torch.randn(tokens, N, D, generator=generator)
    pseudo_query = torch.randn(S, D, generator=generator) / D**0.5
    return [block_res.to(device), torch.tensor([valid], dtype=torch.uint64, device=device), pseudo_query.to(device)]


def update_inputs(device, seed=1, tokens=T):
    """partial_block, delta (bf16), pseudo_query, and slot 0 of a prepare's states."""
    block_res, valid, queries = prepare_inputs("cpu", seed=seed, tokens=tokens)
    numerator, logit_max, exp_sum = ATTNRES.block_attn_res_prepare(block_res, valid, queries, eps=EPS)
    generator = torch.Generator().manual_seed(seed + 1)
    partial = torch.randn(tokens, D, generator=generator)
    delta = torch.randn(tokens, D, generator=generator).bfloat16()
    tensors = [partial, delta, queries[0], numerator[0], logit_max[0], exp_sum[0]]
    return [tensor.clone().to(device) for tensor in tensors]


def prepare(op=ATTNRES.block_attn_res_prepare.default):
    return lambda block_res, valid, queries: op(block_res, valid, queries, eps=EPS)


def update(op=ATTNRES.block_attn_res_update.default):
    return lambda partial, delta, queries, numerator, logit_max, exp_sum: op(
        partial, delta, queries, numerator, logit_max, exp_sum, eps=EPS)


@pytest.fixture(scope="module", params=["meta", "cpu"])
def device(request):
    return request.param


@pytest.fixture(scope="module")
def prepared(device):
    inputs = prepare_inputs(device)
    captured = compile_and_capture(prepare(), *inputs)
    [graph] = captured.graphs
    return graph, only_op(graph, PREPARE.op_type), inputs, captured


@pytest.fixture(scope="module")
def updated(device):
    """The update compiled and run on fresh inputs; partial_block is the caller's tensor, checked after."""
    inputs = update_inputs(device)
    before = inputs[0].clone()
    captured = compile_and_capture(update(), *inputs)
    [graph] = captured.graphs
    return graph, only_op(graph, UPDATE.op_type), inputs, before, captured


def test_our_converters_are_the_ones_torchair_calls():
    for op in (ATTNRES.block_attn_res_prepare.default, ATTNRES.block_attn_res_update.default):
        converter = _get_converter(op)
        assert converter is not None and converter.__module__.startswith("attnres_ge.ge_plugin"), op


def test_prepare_node(prepared):
    graph, op, _, _ = prepared
    assert graph.op_types() == ["Data"] * 3 + [PREPARE.op_type, "NetOutput"]
    assert_node_matches_prototype(op, PREPARE)
    assert list(op.input) == [f"arg{i}_1:0" for i in range(3)]
    assert [desc.dtype for desc in op.input_desc] == [F32, U64, F32]
    assert attr_values(op) == {"eps": pytest.approx(EPS)}
    assert output_dtypes(op) == {"numerator": F32, "logit_max": F32, "exp_sum": F32}
    assert graph.hint_output_shapes == [[S, T, D], [S, T], [S, T]]


def test_prepare_runs_on_local_ge_bit_for_bit(prepared, device):
    _, _, inputs, captured = prepared
    outputs = captured.value()
    expected = prepare()(*inputs)
    for name, actual, wanted in zip(PREPARE.output_names(), outputs, expected, strict=True):
        if device == "meta":
            assert (actual.device.type, actual.dtype, actual.shape) == ("meta", wanted.dtype, wanted.shape), name
        else:
            assert_bitwise_equal(name, actual, wanted)


def test_update_node_and_its_reference_output(updated):
    """torchair copies the updated input first (TensorMove, auto_functionalized_v2's clone) and takes the new
    partial_block from the node's output of that name: output 0, the reference output."""
    graph, op, _, _, _ = updated
    assert graph.op_types() == ["Data"] * 6 + ["TensorMove", UPDATE.op_type, "NetOutput"]
    assert_node_matches_prototype(op, UPDATE)
    [move] = graph.ops_of_type("TensorMove")
    assert list(move.input) == ["arg0_1:0"]
    assert list(op.input) == [f"{move.name}:0"] + [f"arg{i}_1:0" for i in range(1, 6)]
    assert [desc.dtype for desc in op.input_desc] == [F32, BF16, F32, F32, F32, F32]
    assert attr_values(op) == {"eps": pytest.approx(EPS)}
    assert output_dtypes(op) == {"partial_block": F32, "h": BF16}
    [net_output] = graph.ops_of_type("NetOutput")
    assert list(net_output.input) == [f"{op.name}:1", f"{op.name}:0"]  # h, then partial_block's new value


def test_update_runs_on_local_ge_bit_for_bit_and_updates_the_callers_partial_block(updated, device):
    _, _, inputs, before, captured = updated
    h = captured.value()  # the op returns h alone
    eager_inputs = [before.clone(), *inputs[1:]]
    want = update()(*eager_inputs)
    if device == "meta":
        assert (h.device.type, h.dtype, h.shape) == ("meta", want.dtype, want.shape)
        return
    assert_bitwise_equal("h", h, want)
    assert_bitwise_equal("partial_block after the call", inputs[0], eager_inputs[0])
    assert not torch.equal(inputs[0], before), "the caller's partial_block was not updated"


def test_a_new_valid_blocks_value_runs_the_same_graph():
    block_res, _, queries = prepare_inputs("cpu")
    compiled = npu_compile(prepare())
    runs = {}

    def step():
        for count in (0, 1, N, 2):
            valid = torch.tensor([count], dtype=torch.uint64)
            runs[count] = (compiled(block_res, valid, queries), prepare()(block_res, valid, queries))

    captured = capture(step)
    assert len(captured.graphs) == 1 and captured.graphs[0].runs == 4, [g.name for g in captured.graphs]
    for count, (outputs, expected) in runs.items():
        for name, actual, wanted in zip(PREPARE.output_names(), outputs, expected, strict=True):
            assert_bitwise_equal(f"{name} at valid_blocks={count}", actual, wanted)


@pytest.mark.parametrize("which", ["prepare", "update"])
def test_dynamic_tokens_run_one_graph_bit_for_bit(which):
    make, make_inputs = {"prepare": (prepare, prepare_inputs), "update": (update, update_inputs)}[which]
    compiled = npu_compile(make(), dynamic=True)
    results = []

    def step():
        for seed, tokens in enumerate((5, 9, 3)):
            graph_inputs, eager_inputs = (make_inputs("cpu", seed=seed, tokens=tokens) for _ in range(2))
            results.append((tokens, compiled(*graph_inputs), make()(*eager_inputs), graph_inputs, eager_inputs))

    captured = capture(step)
    assert len(captured.graphs) == 1 and captured.graphs[0].runs == 3, [g.name for g in captured.graphs]
    op = only_op(captured.graphs[0], PREPARE.op_type if which == "prepare" else UPDATE.op_type)
    assert any(-1 in desc.shape.dim for desc in op.input_desc), "the graph was built for one token count"
    for tokens, got, want, graph_inputs, eager_inputs in results:
        for index, (actual, wanted) in enumerate(zip(flat(got), flat(want), strict=True)):
            assert_bitwise_equal(f"output {index} at T={tokens}", actual, wanted)
        assert_bitwise_equal(f"first input after the call at T={tokens}", graph_inputs[0], eager_inputs[0])


def flat(value):
    return list(value) if isinstance(value, (tuple, list)) else [value]


def define_alias(namespace: str, op_name: str, schema: str, target, mutates_args=()):
    """Test-only torch op `<namespace>::<op_name>` with `schema` that computes through `target`."""
    op = torch.library.custom_op(f"{namespace}::{op_name}", lambda *a, **k: target(*a, **k),
                                 mutates_args=mutates_args, schema=schema)
    op.register_fake(lambda *a, **k: target(*a, **k))
    return getattr(getattr(torch.ops, namespace), op_name).default


# For the converter torchair generates from the op name (block_attn_res_update -> BlockAttnResUpdate).
AUTO_PREPARE = define_alias("attnres_auto", "block_attn_res_prepare", PREPARE_SCHEMA, ATTNRES.block_attn_res_prepare)
AUTO_UPDATE = define_alias("attnres_auto", "block_attn_res_update", UPDATE_SCHEMA, ATTNRES.block_attn_res_update,
                           mutates_args=("partial_block",))
# For torchair's positional custom_op(op_type, *inputs, *attributes), which maps them by our prototypes.
POSITIONAL_PREPARE = define_alias("attnres_positional", "block_attn_res_prepare", PREPARE_SCHEMA,
                                  ATTNRES.block_attn_res_prepare)
POSITIONAL_UPDATE = define_alias("attnres_positional", "block_attn_res_update", UPDATE_SCHEMA,
                                 ATTNRES.block_attn_res_update, mutates_args=("partial_block",))


@torchair.register_fx_node_ge_converter(POSITIONAL_PREPARE)
def convert_positional_prepare(block_res, valid_blocks, pseudo_query, *, eps=1e-6, meta_outputs=None):
    return torchair.ge.custom_op(PREPARE.op_type, block_res, valid_blocks, pseudo_query, eps)


@torchair.register_fx_node_ge_converter(POSITIONAL_UPDATE)
def convert_positional_update(partial_block, delta, pseudo_query, numerator, logit_max, exp_sum, *, eps=1e-6,
                              meta_outputs=None):
    _, h = torchair.ge.custom_op(UPDATE.op_type, partial_block, delta, pseudo_query, numerator, logit_max, exp_sum,
                                 eps)
    return h


@pytest.mark.parametrize("way", ["automatic", "positional"])
@pytest.mark.parametrize("which", ["prepare", "update"])
def test_torchairs_own_ways_build_the_node_ours_does(which, way):
    make, inputs, proto = {
        "prepare": (prepare, lambda: prepare_inputs("meta"), PREPARE),
        "update": (update, lambda: update_inputs("meta"), UPDATE),
    }[which]
    other = {("prepare", "automatic"): AUTO_PREPARE, ("update", "automatic"): AUTO_UPDATE,
             ("prepare", "positional"): POSITIONAL_PREPARE, ("update", "positional"): POSITIONAL_UPDATE}[which, way]
    if way == "automatic":
        assert _get_converter(other) is None
    [ours] = compile_and_capture(make(), *inputs()).graphs
    [theirs] = compile_and_capture(make(other), *inputs()).graphs
    if way == "automatic":
        assert getattr(other, "_ge_converter", None) is not None, "torchair did not generate a converter"
    assert node_signature(only_op(theirs, proto.op_type)) == node_signature(only_op(ours, proto.op_type))
    assert theirs.op_types() == ours.op_types()
    [net_ours], [net_theirs] = ours.ops_of_type("NetOutput"), theirs.ops_of_type("NetOutput")
    assert list(net_theirs.input) == list(net_ours.input)


def update_norm(partial, delta, queries, numerator, logit_max, exp_sum, weight):
    return ATTNRES.block_attn_res_update_norm(partial, delta, queries, numerator, logit_max, exp_sum, weight, eps=EPS,
                                              output_eps=2 * EPS)


def test_update_norm_is_cann_update_then_rms_norm():
    """CANN's GE has no BlockAttnResUpdateNorm: the update, then RmsNorm of its h. Meta inputs: the graph only
    (the stand-in cannot run RmsNorm)."""
    inputs = [*update_inputs("meta"), torch.empty(D, dtype=torch.bfloat16, device="meta")]
    [graph] = capture(lambda: npu_compile(update_norm)(*inputs)).graphs
    assert "BlockAttnResUpdateNorm" not in graph.op_types()
    update_op, norm = only_op(graph, UPDATE.op_type), only_op(graph, "RmsNorm")
    assert attr_values(update_op) == {"eps": pytest.approx(EPS)}
    assert list(norm.input)[:2] == [f"{update_op.name}:1", "arg6_1:0"]  # h and the weight
    assert attr_values(norm)["epsilon"] == pytest.approx(2 * EPS)
    # partial_block's new value: the copy the update wrote in place (its reference input), which torchair reads
    # through an Identity ordered after the converter's last node (the update is not that node: RmsNorm is).
    [move], [identity], [net_output] = (graph.ops_of_type(kind) for kind in ("TensorMove", "Identity", "NetOutput"))
    assert update_op.input[0] == f"{move.name}:0" and f"{move.name}:0" in identity.input
    assert list(net_output.input) == [f"{norm.name}:0", f"{identity.name}:0"]


def test_update_norm_with_a_weight_in_another_dtype_is_refused():
    inputs = [*update_inputs("meta"), torch.empty(D, dtype=torch.float32, device="meta")]
    with pytest.raises(Exception, match="BlockAttnResUpdateNorm under torchair: CANN's RmsNorm needs "
                                        "output_norm_weight in delta's dtype"):
        capture(lambda: npu_compile(update_norm)(*inputs))
