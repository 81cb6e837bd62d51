"""Shared by the interop tests: compile with torchair and capture, inputs, node checks and comparisons."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torchair
import torchair_standin
from torchair._ge_concrete_graph.ge_ir_pb2 import DataType as ProtoDataType  # ge.proto numbering

from attnres_ge.op_proto import OpPrototype

# AttrDef's `value` oneof field -> the prototype's attribute kind.
ATTR_FIELD_KINDS = {"i": "Int", "f": "Float", "b": "Bool", "s": "Str"}
TORCH_TO_PROTO_DTYPE = {
    torch.float32: ProtoDataType.Value("DT_FLOAT"),
    torch.float16: ProtoDataType.Value("DT_FLOAT16"),
    torch.bfloat16: ProtoDataType.Value("DT_BF16"),
}
DEBUG_DESC_ATTRS = ("_meta", "_fx_tensor_name")  # torchair's debugging notes on tensor descs
DTYPE_IDS = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}


def make_inputs(tokens, blocks, hidden, dtype=torch.float32, device="cpu", seed=0, requires_grad=False):
    """partial_block [T, H], block_res [T, N, H], proj_weight [1, H], norm_weight [H]."""
    generator = torch.Generator().manual_seed(seed)
    shapes = ((tokens, hidden), (tokens, blocks, hidden), (1, hidden), (hidden,))
    scales = (1.0, 1.0, 0.5 / hidden**0.5, 0.2)
    tensors = [scale * torch.randn(*shape, generator=generator) for shape, scale in zip(shapes, scales, strict=True)]
    tensors[3] = tensors[3] + 1  # norm_weight near 1
    return [t.to(dtype=dtype, device=device).requires_grad_(requires_grad) for t in tensors]


@dataclass
class Capture:
    """What one compiled call left: the graphs torchair loaded, and the result or the error of running them."""

    graphs: list
    result: object = None
    error: BaseException | None = None

    def value(self):
        """The call's result; re-raises what the run raised (e.g. the local GE rejecting the graph)."""
        if self.error is not None:
            raise self.error
        return self.result


def capture(step) -> Capture:
    """Call `step()` (which compiles and runs with torchair) and capture the graphs torchair loads.

    A failure after torchair loaded a graph (when a graph runs) is kept in the Capture, so the
    IR checks still see the graph; a failure before any load propagates.
    """
    torch._dynamo.reset()
    since = len(torchair_standin.LOADED)
    try:
        result = step()
    except Exception as error:
        if len(torchair_standin.LOADED) == since:
            raise
        return Capture(torchair_standin.LOADED[since:], error=error)
    return Capture(torchair_standin.LOADED[since:], result)


def npu_compile(fn, **options):
    """torch.compile(fn) as an Ascend user writes it: torchair's backend, one whole graph."""
    return torch.compile(fn, backend=torchair.get_npu_backend(), fullgraph=True, **options)


def compile_and_capture(fn, *args) -> Capture:
    """Capture of `npu_compile(fn)(*args)`."""
    return capture(lambda: npu_compile(fn)(*args))


def only_op(graph, op_type):
    """The single node of `op_type` in a captured LoadedGraph."""
    ops = graph.ops_of_type(op_type)
    assert len(ops) == 1, f"graph {graph.name} should hold one {op_type} node, has {len(ops)}: {graph.op_types()}"
    return ops[0]


def attr_kinds(op) -> dict[str, str]:
    """Prototype attributes of a node: name -> kind read from the AttrDef field that is set."""
    return {name: ATTR_FIELD_KINDS.get(value.WhichOneof("value"), value.WhichOneof("value"))
            for name, value in op.attr.items() if not name.startswith("_")}


def attr_values(op) -> dict:
    return {name: getattr(value, value.WhichOneof("value")) for name, value in op.attr.items()
            if not name.startswith("_")}


def assert_node_matches_prototype(op, proto: OpPrototype) -> None:
    """Type, inputs (names, order, one per input), attributes (names, kinds), outputs (names, order)."""
    assert op.type == proto.op_type
    assert [desc.name for desc in op.input_desc] == proto.input_names(), f"{op.type} input descs"
    assert len(op.input) == len(proto.inputs) and all(op.input), f"{op.type} inputs: {list(op.input)}"
    assert attr_kinds(op) == {attr.name: attr.kind for attr in proto.attrs}, f"{op.type} attributes"
    assert [desc.name for desc in op.output_desc] == proto.output_names(), f"{op.type} output descs"


def output_dtypes(op) -> dict[str, int]:
    return {desc.name: desc.dtype for desc in op.output_desc}


def node_signature(op) -> dict:
    """What a converter decides about a node, minus torchair's debugging attrs on tensor descs."""

    def desc(d):
        kept = {k: str(v) for k, v in d.attr.items() if k not in DEBUG_DESC_ATTRS}
        return (d.name, d.dtype, list(d.shape.dim) if d.HasField("shape") else None, d.layout, d.device_type, kept)

    return {
        "name": op.name,
        "type": op.type,
        "input": list(op.input),
        "input_desc": [desc(d) for d in op.input_desc],
        "output_desc": [desc(d) for d in op.output_desc],
        "attr": {name: str(value) for name, value in op.attr.items()},
    }


def assert_bitwise_equal(name, actual, expected):
    assert actual.dtype == expected.dtype and actual.shape == expected.shape, (
        f"{name}: {actual.dtype}{list(actual.shape)} vs eager {expected.dtype}{list(expected.shape)}"
    )
    as_bytes = (lambda t: t.contiguous().view(torch.uint8)) if actual.numel() else (lambda t: t)
    assert torch.equal(as_bytes(actual), as_bytes(expected)), f"{name} differs bitwise from eager"
