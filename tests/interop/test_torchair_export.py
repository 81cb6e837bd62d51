"""The exported REG_OP headers and msopgen JSON describe exactly the nodes torchair built with our converters.

CANN compiles the headers (graph/operator_reg.h) into the op's IR, and msopgen turns the JSON
into an op project; GE then checks every node torchair sends against that IR. So each name,
order, attribute kind and dtype of the captured node must appear in both files as is.
"""

from __future__ import annotations

import json
import re

import pytest
import torch
import torchair_standin
from interop_helpers import DTYPE_IDS, attr_kinds, compile_and_capture, make_inputs, only_op
from torchair._ge_concrete_graph.ge_ir_pb2 import DataType as ProtoDataType

from attnres_ge.ge_plugin.ops import OPS
from attnres_ge.op_proto import BACKWARD, FORWARD, PREPARE, UPDATE
from attnres_ge.op_proto.export import export_prototypes

T, N, H = 4, 2, 8
MSOPGEN_DTYPES = {"DT_FLOAT": "float", "DT_FLOAT16": "float16", "DT_BF16": "bfloat16", "DT_UINT64": "uint64"}
KINDS_OF_VT = {vt: kind for kind, vt in torchair_standin.VALUE_TYPES.items()}
MSOPGEN_ATTR_KINDS = {"int": "Int", "float": "Float", "bool": "Bool", "str": "Str"}
REG_OP_BLOCK = re.compile(r"REG_OP\((\w+)\)(.*?)\.OP_END_FACTORY_REG\(\1\)", re.S)
REG_OP_INPUT = re.compile(r"\.(?:INPUT|OPTIONAL_INPUT|DYNAMIC_INPUT)\((\w+), TensorType\(\{([^}]*)\}\)\)")
REG_OP_OUTPUT = re.compile(r"\.(?:OUTPUT|DYNAMIC_OUTPUT)\((\w+), TensorType\(\{([^}]*)\}\)\)")
REG_OP_ATTR = re.compile(r"\.(?:REQUIRED_ATTR|ATTR)\((\w+), (\w+)")


def parse_reg_ops(header: str) -> dict:
    """op type -> {"inputs": [(name, {dtypes})], "outputs": [...], "attrs": {name: kind}} (in order)."""

    def tensors(pattern, body):
        return [(name, {t.strip() for t in types.split(",")}) for name, types in pattern.findall(body)]

    return {
        op_type: {"inputs": tensors(REG_OP_INPUT, body), "outputs": tensors(REG_OP_OUTPUT, body),
                  "attrs": dict(REG_OP_ATTR.findall(body))}
        for op_type, body in REG_OP_BLOCK.findall(header)
    }


def parse_msopgen(text: str) -> dict:
    """op type -> the same shape as parse_reg_ops, from msopgen's JSON."""

    def tensors(entries):
        return [(entry["name"], {ge for ge, name in MSOPGEN_DTYPES.items() if name in entry["type"]})
                for entry in entries]

    return {
        op["op"]: {"inputs": tensors(op["input_desc"]), "outputs": tensors(op["output_desc"]),
                   "attrs": {a["name"]: MSOPGEN_ATTR_KINDS[a["type"]] for a in op["attr"]}}
        for op in json.loads(text)
    }


def seen_by_torchair(op) -> dict:
    """The node as GE will check it: names in order with their dtype names, attribute kinds."""
    return {
        "inputs": [(d.name, ProtoDataType.Name(d.dtype)) for d in op.input_desc],
        "outputs": [(d.name, ProtoDataType.Name(d.dtype)) for d in op.output_desc],
        "attrs": attr_kinds(op),
    }


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    *headers, op_json = export_prototypes([op.prototype for op in OPS], tmp_path_factory.mktemp("proto"))
    reg_ops = {}
    for header in headers:  # one <op>_proto.h per op
        reg_ops.update(parse_reg_ops(header.read_text()))
    return {"REG_OP header": reg_ops, "msopgen JSON": parse_msopgen(op_json.read_text())}


@pytest.fixture(scope="module", params=[pytest.param(d, id=name) for d, name in DTYPE_IDS.items()])
def torchair_nodes(request):
    """op type -> the node torchair built (meta inputs of one dtype; statistics float32)."""
    inputs = make_inputs(T, N, H, request.param, "meta")
    forward = compile_and_capture(
        lambda *a: torch.ops.attnres.block_attention_residuals(*a, -1, 1e-6, True), *inputs).graphs[0]
    grads = [torch.empty(T, H, dtype=request.param, device="meta"), *(torch.empty(T, N + 1, device="meta"),) * 2]
    backward = compile_and_capture(torch.ops.attnres.block_attention_residuals_backward, *inputs, *grads).graphs[0]
    return {FORWARD.op_type: only_op(forward, FORWARD.op_type), BACKWARD.op_type: only_op(backward, BACKWARD.op_type)}


@pytest.fixture(scope="module")
def two_phase_nodes():
    """op type -> the node torchair built for the two-phase ops (meta inputs: CANN's dtypes, bf16 delta)."""
    def meta(*shape, dtype=torch.float32):
        return torch.empty(*shape, dtype=dtype, device="meta")

    prepare = compile_and_capture(lambda *a: torch.ops.attnres.block_attn_res_prepare(*a),
                                  meta(T, N, H), meta(1, dtype=torch.uint64), meta(3, H)).graphs[0]
    update = compile_and_capture(lambda *a: torch.ops.attnres.block_attn_res_update(*a),
                                 meta(T, H), meta(T, H, dtype=torch.bfloat16), meta(H), meta(T, H), meta(T),
                                 meta(T)).graphs[0]
    return {PREPARE.op_type: only_op(prepare, PREPARE.op_type), UPDATE.op_type: only_op(update, UPDATE.op_type)}


@pytest.mark.parametrize("source", ["REG_OP header", "msopgen JSON"])
def test_exported_ops_are_exactly_ours(exported, source):
    assert list(exported[source]) == [FORWARD.op_type, BACKWARD.op_type, PREPARE.op_type, UPDATE.op_type]
    assert list(exported[source]) == [op.op_type for op in OPS]


@pytest.mark.parametrize("source", ["REG_OP header", "msopgen JSON"])
@pytest.mark.parametrize("op_type", [FORWARD.op_type, BACKWARD.op_type])
def test_export_describes_the_node_torchair_built(exported, torchair_nodes, source, op_type):
    assert_export_describes(exported[source][op_type], seen_by_torchair(torchair_nodes[op_type]), source, op_type)


@pytest.mark.parametrize("source", ["REG_OP header", "msopgen JSON"])
@pytest.mark.parametrize("op_type", [PREPARE.op_type, UPDATE.op_type])
def test_export_describes_the_two_phase_node_torchair_built(exported, two_phase_nodes, source, op_type):
    """For BlockAttnResUpdate, partial_block is declared as an input and an output (its reference output)."""
    assert_export_describes(exported[source][op_type], seen_by_torchair(two_phase_nodes[op_type]), source, op_type)


def assert_export_describes(declared, node, source, op_type):
    for part in ("inputs", "outputs"):
        assert [name for name, _ in declared[part]] == [name for name, _ in node[part]], f"{source} {op_type} {part}"
        for (name, dtypes), (_, dtype) in zip(declared[part], node[part], strict=True):
            assert dtype in dtypes, f"{source} {op_type}: {part[:-1]} {name} does not allow {dtype} ({dtypes})"
    assert declared["attrs"] == node["attrs"], f"{source} {op_type} attributes"  # a node's attrs are a map


@pytest.mark.parametrize("source", ["REG_OP header", "msopgen JSON"])
@pytest.mark.parametrize("op_type", [FORWARD.op_type, BACKWARD.op_type, PREPARE.op_type, UPDATE.op_type])
def test_export_orders_as_torchair_was_told(exported, source, op_type):
    """The positional custom_op and the automatic converter map arguments in this order."""
    status, inputs, outputs, attrs = torchair_standin.get_registered_ir_def(op_type)
    declared = exported[source][op_type]
    assert status == "SUCCESS"
    assert [name for name, _ in declared["inputs"]] == [name for name, _ in inputs]
    assert [name for name, _ in declared["outputs"]] == [name for name, _ in outputs]
    assert list(declared["attrs"].items()) == [(name, KINDS_OF_VT[vt]) for name, vt in attrs]
