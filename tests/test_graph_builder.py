"""The local `ge` graph-building API and the converters: nodes written as GE's ge.proto says; misuse caught."""

from __future__ import annotations

import pytest
import torch

import attnres_ge  # noqa: F401
from attnres_ge.ge_plugin import ge, ge_attr, ge_ir
from attnres_ge.ge_plugin.converters import make_converter
from attnres_ge.ge_plugin.ops import BLOCK_ATTENTION_RESIDUALS, BLOCK_ATTENTION_RESIDUALS_GRAD
from attnres_ge.op_proto import AttnResInputError

convert_block_attention_residuals = make_converter(BLOCK_ATTENTION_RESIDUALS, ge)
convert_block_attention_residuals_backward = make_converter(BLOCK_ATTENTION_RESIDUALS_GRAD, ge)

T, N, H = 5, 3, 8
FORWARD_INPUTS = ["partial_block", "block_res", "proj_weight", "norm_weight"]
BACKWARD_INPUTS = [*FORWARD_INPUTS, "grad_hidden_states", "inv_norm", "probs"]


def _forward_data(dtype=torch.float32, tokens=T):
    return (
        ge.Data(0, dtype, [tokens, H], node_name="partial"),
        ge.Data(1, dtype, [tokens, N, H], node_name="blocks"),
        ge.Data(2, dtype, [1, H], node_name="proj"),
        ge.Data(3, dtype, [H], node_name="norm"),
    )


def _attrs(op) -> dict:
    """{attr name: (AttrDef field set, its value)}."""
    fields = {name: value.WhichOneof("value") for name, value in op.attr.items()}
    return {name: (field, getattr(op.attr[name], field)) for name, field in fields.items()}


def test_data_node_convention():
    with ge.Graph("g") as graph:
        x = ge.Data(3, torch.bfloat16, [-1, 4])
    op = graph.graph_def.op[0]
    assert (op.type, op.name, _attrs(op)) == ("Data", "Data", {"index": ("i", 3)})
    assert op.output_desc[0].dtype == ge_ir.DT_BF16 and list(op.output_desc[0].shape.dim) == [-1, 4]
    assert (x.ref, x.dtype, x.shape) == ("Data:0", torch.bfloat16, (-1, 4))


def test_forward_converter_writes_the_opdef():
    with ge.Graph("g") as graph:
        outputs = convert_block_attention_residuals(*_forward_data(), -1, 1e-5, True)
        ge.NetOutput(outputs)
    op = graph.graph_def.op[4]
    assert op.type == "BlockAttentionResiduals"
    assert list(op.input) == ["partial:0", "blocks:0", "proj:0", "norm:0"]
    assert [d.name for d in op.input_desc] == FORWARD_INPUTS
    assert [list(d.shape.dim) for d in op.input_desc] == [[T, H], [T, N, H], [1, H], [H]]
    assert [d.name for d in op.output_desc] == ["hidden_states", "inv_norm", "probs"]
    attrs = _attrs(op)
    assert attrs["valid_block_num"] == ("i", -1) and attrs["need_backward"] == ("b", True)
    assert attrs["norm_eps"][0] == "f" and attrs["norm_eps"][1] == pytest.approx(1e-5)
    net_output = graph.graph_def.op[5]
    assert net_output.type == "NetOutput"
    assert list(net_output.input) == [f"{op.name}:{i}" for i in range(3)]


def test_backward_converter_writes_the_opdef():
    with ge.Graph("g") as graph:
        data = _forward_data()
        extra = (ge.Data(4, torch.float32, [T, H]), ge.Data(5, torch.float32, [T, N + 1]),
                 ge.Data(6, torch.float32, [T, N + 1]))
        outputs = convert_block_attention_residuals_backward(*data, *extra)
    op = graph.op(outputs[0].node)
    assert op.type == "BlockAttentionResidualsGrad"
    assert [d.name for d in op.input_desc] == BACKWARD_INPUTS
    assert _attrs(op) == {"valid_block_num": ("i", 0)}
    assert [d.name for d in op.output_desc] == ["grad_partial_block", "grad_block_res", "grad_proj_weight",
                                                "grad_norm_weight"]
    assert len(outputs) == 4


def test_node_names_are_unique():
    with ge.Graph("g") as graph:
        data = _forward_data()
        convert_block_attention_residuals(*data)
        convert_block_attention_residuals(*data)
    names = [op.name for op in graph.graph_def.op]
    assert len(names) == len(set(names))
    assert "BlockAttentionResiduals_1" in names


def _custom_with(make_overrides):
    """A valid forward custom_op call with `make_overrides(data)` replacing some of its arguments."""
    with ge.Graph("g"):
        data = dict(zip(FORWARD_INPUTS, _forward_data(), strict=True))
        call = {"op_type": "BlockAttentionResiduals", "inputs": data,
                "outputs": ["hidden_states", "inv_norm", "probs"], "attrs": {"norm_eps": ge_attr.Float(1e-6)}}
        call.update(make_overrides(data))
        return ge.custom_op(**call)


@pytest.mark.parametrize(
    ("make_overrides", "message"),
    [
        pytest.param(lambda d: {"op_type": "NoSuchOp"},
                     r"NoSuchOp \(graph build, prototype check\): unknown op type", id="unknown-type"),
        pytest.param(lambda d: {"inputs": {**d, "bias": d["norm_weight"]}}, r"unknown input 'bias'",
                     id="unknown-input"),
        pytest.param(lambda d: {"inputs": {k: v for k, v in d.items() if k != "block_res"}},
                     r"BlockAttentionResiduals .*required input 'block_res' is missing", id="missing-input"),
        pytest.param(lambda d: {"inputs": {**d, "block_res": None}}, r"required input 'block_res' is missing",
                     id="none-input"),
        pytest.param(lambda d: {"outputs": ["hidden_states"]}, r"outputs must be the prototype's",
                     id="wrong-outputs"),
        pytest.param(lambda d: {"attrs": {"norm_eps": ge_attr.Int(1)}},
                     r"attribute 'norm_eps' must be Float, got ge.attr.Int", id="attr-wrong-kind"),
        pytest.param(lambda d: {"attrs": {"need_backward": True}},
                     r"attribute 'need_backward' must be a ge.attr.Bool", id="attr-not-wrapped"),
        pytest.param(lambda d: {"attrs": {"alpha": ge_attr.Float(1.0)}}, r"unknown attribute 'alpha'",
                     id="unknown-attr"),
    ],
)
def test_custom_op_misuse_names_op_and_field(make_overrides, message):
    with pytest.raises(AttnResInputError, match=message):
        _custom_with(make_overrides)


def test_custom_op_returns_one_tensor_per_output():
    outputs = _custom_with(lambda d: {})
    assert [t.index for t in outputs] == [0, 1, 2]


def test_custom_op_outside_a_graph_is_an_error():
    with pytest.raises(ge.GraphBuildError, match="no graph is open"):
        ge.Data(0, torch.float32, [1])


def test_tensor_from_another_graph_is_rejected():
    with ge.Graph("first"):
        stray = ge.Data(0, torch.float32, [T, H])
    with ge.Graph("second"), pytest.raises(AttnResInputError, match="input 'partial_block' must be a tensor of"):
        data = _forward_data()
        ge.custom_op("BlockAttentionResiduals", inputs={**dict(zip(FORWARD_INPUTS, data, strict=True)),
                                                        "partial_block": stray},
                     outputs=["hidden_states", "inv_norm", "probs"])


@pytest.mark.parametrize(
    "value",
    [ge_attr.Int(-3), ge_attr.Float(0.5), ge_attr.Bool(False), ge_attr.Str("ND"), ge_attr.DataType(ge_ir.DT_BF16),
     ge_attr.ListInt([1, 2]), ge_attr.ListFloat([0.5, 2.0]), ge_attr.ListBool([True, False]),
     ge_attr.ListStr(["a", "b"]), ge_attr.ListDataType([1, 27])],
    ids=lambda v: type(v).__name__,
)
def test_attr_write_then_read_round_trips(value):
    attr_def = ge_ir.AttrDef()
    value.write(attr_def)
    assert ge_attr.read(attr_def) == value


def test_attr_fields_match_ge_ir():
    expectations = {ge_attr.Int(1): "i", ge_attr.Float(1.0): "f", ge_attr.Bool(True): "b", ge_attr.Str("x"): "s",
                    ge_attr.DataType(1): "dt", ge_attr.ListInt([1]): "list"}
    for value, field in expectations.items():
        attr_def = ge_ir.AttrDef()
        value.write(attr_def)
        assert attr_def.WhichOneof("value") == field, value
    attr_def = ge_ir.AttrDef()
    ge_attr.ListInt([4]).write(attr_def)
    assert attr_def.list.val_type == ge_ir.ListValueType.Value("VT_LIST_INT")


@pytest.mark.parametrize(
    ("make", "value"),
    [(ge_attr.Int, True), (ge_attr.Int, 1.5), (ge_attr.Float, "x"), (ge_attr.Bool, 1), (ge_attr.Str, 3),
     (ge_attr.ListInt, 3), (ge_attr.ListInt, [1.0])],
)
def test_attr_wrappers_reject_wrong_python_types(make, value):
    with pytest.raises(TypeError, match=f"ge.attr.{make.kind}"):
        make(value)
