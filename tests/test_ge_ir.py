"""The ge.proto messages: GE's names, field numbers and types; round trips; unknown fields survive."""

from __future__ import annotations

import pytest
from google.protobuf import descriptor_pool
from google.protobuf.descriptor import FieldDescriptor as F

from attnres_ge.ge_plugin import ge_ir

REPEATED = "repeated"

# (message, field) -> (number, type, repeated?) as GE's ge.proto declares them.
EXPECTED_FIELDS = {
    ("ShapeDef", "dim"): (1, F.TYPE_INT64, True),
    ("TensorDescriptor", "name"): (1, F.TYPE_STRING, False),
    ("TensorDescriptor", "dtype"): (2, F.TYPE_ENUM, False),
    ("TensorDescriptor", "shape"): (3, F.TYPE_MESSAGE, False),
    ("TensorDescriptor", "layout"): (4, F.TYPE_STRING, False),
    ("TensorDescriptor", "attr"): (5, F.TYPE_MESSAGE, True),
    ("TensorDef", "desc"): (1, F.TYPE_MESSAGE, False),
    ("TensorDef", "data"): (2, F.TYPE_BYTES, False),
    ("AttrDef", "list"): (1, F.TYPE_MESSAGE, False),
    ("AttrDef", "s"): (2, F.TYPE_BYTES, False),
    ("AttrDef", "i"): (3, F.TYPE_INT64, False),
    ("AttrDef", "f"): (4, F.TYPE_FLOAT, False),
    ("AttrDef", "b"): (5, F.TYPE_BOOL, False),
    ("AttrDef", "bt"): (7, F.TYPE_BYTES, False),
    ("AttrDef", "td"): (11, F.TYPE_MESSAGE, False),
    ("AttrDef", "t"): (12, F.TYPE_MESSAGE, False),
    ("AttrDef", "g"): (13, F.TYPE_MESSAGE, False),
    ("AttrDef", "dt"): (15, F.TYPE_INT64, False),
    ("AttrDef.ListValue", "s"): (2, F.TYPE_BYTES, True),
    ("AttrDef.ListValue", "i"): (3, F.TYPE_INT64, True),
    ("AttrDef.ListValue", "f"): (4, F.TYPE_FLOAT, True),
    ("AttrDef.ListValue", "b"): (5, F.TYPE_BOOL, True),
    ("AttrDef.ListValue", "dt"): (12, F.TYPE_INT64, True),
    ("AttrDef.ListValue", "val_type"): (20, F.TYPE_ENUM, False),
    ("OpDef", "name"): (1, F.TYPE_STRING, False),
    ("OpDef", "type"): (2, F.TYPE_STRING, False),
    ("OpDef", "input"): (5, F.TYPE_STRING, True),
    ("OpDef", "attr"): (10, F.TYPE_MESSAGE, True),
    ("OpDef", "input_desc"): (33, F.TYPE_MESSAGE, True),
    ("OpDef", "output_desc"): (34, F.TYPE_MESSAGE, True),
    ("GraphDef", "name"): (1, F.TYPE_STRING, False),
    ("GraphDef", "input"): (4, F.TYPE_STRING, True),
    ("GraphDef", "output"): (5, F.TYPE_STRING, True),
    ("GraphDef", "op"): (6, F.TYPE_MESSAGE, True),
    ("GraphDef", "attr"): (11, F.TYPE_MESSAGE, True),
    ("ModelDef", "name"): (1, F.TYPE_STRING, False),
    ("ModelDef", "version"): (2, F.TYPE_UINT32, False),
    ("ModelDef", "graph"): (7, F.TYPE_MESSAGE, True),
    ("ModelDef", "attr"): (11, F.TYPE_MESSAGE, True),
}

EXPECTED_DATA_TYPES = {
    "DT_UNDEFINED": 0, "DT_FLOAT": 1, "DT_FLOAT16": 2, "DT_INT8": 3, "DT_UINT8": 4, "DT_INT16": 5,
    "DT_UINT16": 6, "DT_INT32": 7, "DT_INT64": 8, "DT_UINT32": 9, "DT_UINT64": 10, "DT_BOOL": 11,
    "DT_DOUBLE": 12, "DT_STRING": 13, "DT_COMPLEX64": 16, "DT_COMPLEX128": 17, "DT_BF16": 27,
}
EXPECTED_LIST_TYPES = ["NONE", "STRING", "INT", "FLOAT", "BOOL", "BYTES", "TENSOR_DESC", "TENSOR", "GRAPH",
                       "NAMED_ATTRS", "DATA_TYPE"]


def _message(path: str):
    return ge_ir.POOL.FindMessageTypeByName("ge.proto." + path)


@pytest.mark.parametrize(("message", "field"), list(EXPECTED_FIELDS), ids=lambda v: v)
def test_field_number_and_type_match_ge_ir(message, field):
    number, kind, repeated = EXPECTED_FIELDS[(message, field)]
    descriptor = _message(message).fields_by_name[field]
    assert (descriptor.number, descriptor.type, descriptor.is_repeated) == (number, kind, repeated), (
        f"ge.proto.{message}.{field}"
    )


def test_enums_match_ge_ir():
    assert {v.name: v.number for v in ge_ir.DataType.DESCRIPTOR.values} == EXPECTED_DATA_TYPES
    list_types = {v.name: v.number for v in ge_ir.ListValueType.DESCRIPTOR.values}
    assert list_types == {f"VT_LIST_{name}": number for number, name in enumerate(EXPECTED_LIST_TYPES)}


def test_package_is_ge_proto_and_attr_value_is_a_oneof():
    assert ge_ir.DESCRIPTOR.package == "ge.proto"
    oneof = _message("AttrDef").oneofs_by_name["value"]
    assert {f.name for f in oneof.fields} == {"list", "s", "i", "f", "b", "bt", "td", "t", "g", "dt"}


def test_messages_stay_out_of_the_default_pool():
    # torchair registers its own ge.proto there; ours must not collide with it.
    with pytest.raises(KeyError):
        descriptor_pool.Default().FindMessageTypeByName("ge.proto.GraphDef")


def _sample_model() -> ge_ir.ModelDef:
    model = ge_ir.ModelDef(name="model", version=1)
    graph = model.graph.add(name="main", input=["x"], output=["op:0"])
    data = graph.op.add(name="x", type="Data")
    data.attr["index"].i = 0
    desc = data.output_desc.add(name="y", dtype=ge_ir.DT_BF16, layout="ND")
    desc.shape.dim.extend([-1, 8])
    op = graph.op.add(name="op", type="BlockAttentionResiduals", input=["x:0", ""])
    op.attr["norm_eps"].f = 1e-6
    op.attr["need_backward"].b = True
    op.attr["name"].s = b"text"
    op.attr["ints"].list.i.extend([1, -2])
    op.attr["ints"].list.val_type = ge_ir.ListValueType.Value("VT_LIST_INT")
    op.attr["sub"].g.name = "subgraph"
    op.attr["dtype"].dt = ge_ir.DT_FLOAT16
    graph.attr["note"].s = b"graph attr"
    model.attr["m"].i = 7
    return model


def test_model_round_trip_is_lossless():
    model = _sample_model()
    parsed = ge_ir.ModelDef.FromString(model.SerializeToString())
    assert parsed == model
    assert parsed.graph[0].op[1].attr["ints"].list.i == [1, -2]
    assert parsed.graph[0].op[0].output_desc[0].shape.dim == [-1, 8]


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _unknown_fields() -> bytes:
    """Field 50 varint 123 and field 51 bytes b'abc': numbers no message here declares."""
    return _varint(50 << 3 | 0) + _varint(123) + _varint(51 << 3 | 2) + _varint(3) + b"abc"


def test_unknown_fields_survive_parse_and_serialize():
    op = ge_ir.OpDef(name="op", type="Foo")
    wire = op.SerializeToString() + _unknown_fields()
    parsed = ge_ir.OpDef.FromString(wire)
    assert parsed.name == "op"
    assert _unknown_fields() in parsed.SerializeToString()
    again = ge_ir.OpDef.FromString(parsed.SerializeToString())
    assert again.SerializeToString() == parsed.SerializeToString()


def test_unknown_fields_nested_in_a_graph_survive():
    op = ge_ir.OpDef(name="op", type="Foo")
    op_wire = op.SerializeToString() + _unknown_fields()
    graph_wire = ge_ir.GraphDef(name="g").SerializeToString() + _varint(6 << 3 | 2) + _varint(len(op_wire)) + op_wire
    graph = ge_ir.GraphDef.FromString(graph_wire)
    graph.name = "renamed"  # an edit elsewhere must not drop the op's unknown fields
    reparsed = ge_ir.GraphDef.FromString(graph.SerializeToString())
    assert reparsed.name == "renamed"
    assert _unknown_fields() in reparsed.op[0].SerializeToString()
