"""A GE graph-building API with torchair's shape, writing `ge.proto` GraphDefs (ge_ir.proto).

    with Graph("demo") as graph:
        x = Data(index=0, dtype=torch.float32, shape=[-1, 8])
        y = custom_op("SomeOp", inputs={"x": x}, outputs=["y"], attrs={"alpha": attr.Float(0.5)})
        NetOutput([y])
    graph.graph_def  # the GraphDef

Converters are written against this module's names (`custom_op`, `attr.Int`, ...) so the same
function body also runs against `torchair.ge` on an Ascend machine.

`custom_op` is the prototype check: the op type must be registered (op_proto), inputs named
as the prototype names them (required ones present), attributes known and of the prototype's
type. It writes the OpDef as GE writes it: one input_desc per prototype input in order,
one output_desc per prototype output, attributes under their prototype names. Output descs
stay DT_UNDEFINED until the local GE's InferShape (or `set_traced_meta`) fills them.
A dynamic input (a list of tensors) or output is written as GE and torchair write it: one entry
per tensor, its descs numbered after the prototype's name (`sources0`, `sources1`, ...); the
caller names a dynamic output with its count, `("grad_sources", 3)`, and gets a list for it.
"""

from __future__ import annotations

import contextvars
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from attnres_ge.ge_plugin import ge_attr as attr
from attnres_ge.ge_plugin.ge_ir import DT_UNDEFINED, DataType, GraphDef, OpDef, TensorDescriptor
from attnres_ge.ge_plugin.ops import op_for_type
from attnres_ge.op_proto import WHERE_PROTOTYPE
from attnres_ge.op_proto.op_def import Checker, OpPrototype, TensorArg

UNKNOWN_DIM = -1
LAYOUT_ND = "ND"

TORCH_TO_GE_DTYPE = {
    torch.float32: DataType.Value("DT_FLOAT"),
    torch.float16: DataType.Value("DT_FLOAT16"),
    torch.bfloat16: DataType.Value("DT_BF16"),
    torch.float64: DataType.Value("DT_DOUBLE"),
    torch.int8: DataType.Value("DT_INT8"),
    torch.uint8: DataType.Value("DT_UINT8"),
    torch.int16: DataType.Value("DT_INT16"),
    torch.uint16: DataType.Value("DT_UINT16"),
    torch.int32: DataType.Value("DT_INT32"),
    torch.int64: DataType.Value("DT_INT64"),
    torch.uint32: DataType.Value("DT_UINT32"),
    torch.uint64: DataType.Value("DT_UINT64"),  # BlockAttnResPrepare's valid_blocks
    torch.bool: DataType.Value("DT_BOOL"),
    torch.complex64: DataType.Value("DT_COMPLEX64"),
    torch.complex128: DataType.Value("DT_COMPLEX128"),
}
GE_TO_TORCH_DTYPE = {ge_dtype: torch_dtype for torch_dtype, ge_dtype in TORCH_TO_GE_DTYPE.items()}


class GraphBuildError(ValueError):
    """Misuse of the graph-building API (no graph open, a tensor from another graph, ...)."""


def ge_dtype(dtype: torch.dtype) -> int:
    """The GE DataType number of a torch dtype."""
    if dtype not in TORCH_TO_GE_DTYPE:
        raise GraphBuildError(f"torch dtype {dtype} has no GE DataType here; known: {list(TORCH_TO_GE_DTYPE)}")
    return TORCH_TO_GE_DTYPE[dtype]


def torch_dtype(ge_data_type: int) -> torch.dtype:
    """The torch dtype of a GE DataType number."""
    if ge_data_type not in GE_TO_TORCH_DTYPE:
        raise GraphBuildError(f"GE DataType {DataType.Name(ge_data_type)} has no torch dtype here")
    return GE_TO_TORCH_DTYPE[ge_data_type]


def static_dims(shape: Sequence) -> tuple[int, ...]:
    """Shape as GE stores it: ints stay, symbolic (torch.SymInt) or unknown dims become -1."""
    return tuple(dim if isinstance(dim, int) and dim >= 0 else UNKNOWN_DIM for dim in shape)


def write_desc(desc: TensorDescriptor, name: str, dtype: torch.dtype | None, shape: Sequence | None) -> None:
    """Fill a TensorDescriptor; dtype None leaves DT_UNDEFINED, shape None leaves it unset."""
    desc.name = name
    desc.layout = LAYOUT_ND
    desc.dtype = DT_UNDEFINED if dtype is None else ge_dtype(dtype)
    if shape is not None:
        desc.shape.Clear()
        desc.shape.dim.extend(static_dims(shape))


@dataclass(frozen=True)
class GraphTensor:
    """Output `index` of node `node` in `graph`; referred to in the IR as "node:index"."""

    graph: Graph
    node: str
    index: int

    @property
    def ref(self) -> str:
        return f"{self.node}:{self.index}"

    @property
    def desc(self) -> TensorDescriptor:
        return self.graph.op(self.node).output_desc[self.index]

    @property
    def dtype(self) -> torch.dtype | None:
        """torch dtype of the tensor, None while its desc is DT_UNDEFINED."""
        value = self.desc.dtype
        return None if value == DT_UNDEFINED else torch_dtype(value)

    @property
    def shape(self) -> tuple[int, ...]:
        """Dims as stored (-1 = unknown until run time)."""
        return tuple(self.desc.shape.dim)


_current_graph: contextvars.ContextVar[Graph | None] = contextvars.ContextVar("attnres_ge_graph", default=None)


class Graph:
    """A GraphDef under construction; `with Graph(name):` makes it the target of Data/custom_op/NetOutput."""

    def __init__(self, name: str = "graph"):
        self.graph_def = GraphDef(name=name)
        self._ops: dict[str, OpDef] = {}
        self._token = None

    def __enter__(self) -> Graph:
        self._token = _current_graph.set(self)
        return self

    def __exit__(self, *exc) -> None:
        _current_graph.reset(self._token)
        self._token = None

    @property
    def name(self) -> str:
        return self.graph_def.name

    def op(self, name: str) -> OpDef:
        return self._ops[name]

    def add_op(self, op_type: str, name: str | None) -> OpDef:
        """Append an OpDef named `name`, or uniquely after its type when None (Data, Data_1, ...)."""
        base = name or op_type
        unique, suffix = base, 0
        while unique in self._ops:
            suffix += 1
            unique = f"{base}_{suffix}"
        op = self.graph_def.op.add(name=unique, type=op_type)
        self._ops[unique] = op
        return op


def current_graph() -> Graph:
    graph = _current_graph.get()
    if graph is None:
        raise GraphBuildError("no graph is open: build nodes inside `with ge.Graph(name):`")
    return graph


def Data(index: int, dtype: torch.dtype, shape: Sequence, node_name: str | None = None) -> GraphTensor:  # noqa: N802
    """Graph input number `index`: an op of type Data with Int attr `index` and one output desc."""
    graph = current_graph()
    op = graph.add_op("Data", node_name)
    attr.Int(index).write(op.attr["index"])
    write_desc(op.input_desc.add(), "x", dtype, shape)
    write_desc(op.output_desc.add(), "y", dtype, shape)
    graph.graph_def.input.append(op.name)
    return GraphTensor(graph, op.name, 0)


def NetOutput(tensors: Sequence[GraphTensor], node_name: str = "NetOutput") -> None:  # noqa: N802
    """Mark the graph's results: the inputs of one op of type NetOutput, in order."""
    graph = current_graph()
    op = graph.add_op("NetOutput", node_name)
    for position, tensor in enumerate(tensors):
        _check_belongs(graph, tensor, f"NetOutput input {position}")
        op.input.append(tensor.ref)
        desc = op.input_desc.add()
        desc.CopyFrom(tensor.desc)
        desc.name = f"x{position}"
        graph.graph_def.output.append(tensor.ref)


def set_traced_meta(tensor: GraphTensor, dtype: torch.dtype, shape: Sequence) -> None:
    """Record what torch traced for this output (as torchair does from `meta_outputs`); the local
    GE checks its own InferShape against it."""
    desc = tensor.desc
    write_desc(desc, desc.name, dtype, shape)


def _check_belongs(graph: Graph, tensor, what: str) -> None:
    if not isinstance(tensor, GraphTensor):
        raise GraphBuildError(f"{what} must be a graph tensor, got {type(tensor).__name__}")
    if tensor.graph is not graph:
        raise GraphBuildError(f"{what} comes from graph {tensor.graph.name!r}, not the open graph {graph.name!r}")


def dynamic_desc_name(name: str, position: int) -> str:
    """GE's name for tensor `position` of a dynamic input or output `name` (torchair's spelling too)."""
    return f"{name}{position}"


def custom_op(
    op_type: str,
    inputs: Mapping[str, GraphTensor | Sequence[GraphTensor] | None],
    outputs: Sequence[str | tuple[str, int]],
    attrs: Mapping[str, attr.AttrValue] | None = None,
    node_name: str | None = None,
) -> GraphTensor | list[GraphTensor] | tuple:
    """Add a node of a registered op type; one graph tensor per output, a list of them per dynamic output
    (a single output unwrapped).

    Raises AttnResInputError naming the op and the field for an unknown type, an unknown or
    missing required input, an output list that is not the prototype's, an unknown attribute
    or one of the wrong type.
    """
    checker = Checker(op_type, WHERE_PROTOTYPE)
    proto = _lookup_prototype(op_type, checker)
    graph = current_graph()
    _check_input_names(proto, inputs, checker)
    counts = _check_output_names(proto, outputs, checker)
    attrs = dict(attrs or {})
    _check_attrs(proto, attrs, checker)

    op = graph.add_op(op_type, node_name)
    for arg in proto.inputs:
        _write_input(graph, op, arg, inputs.get(arg.name), checker)
    for name, value in attrs.items():
        value.write(op.attr[name])
    results = []
    for arg, count in zip(proto.outputs, counts, strict=True):
        names = [arg.name] if count is None else [dynamic_desc_name(arg.name, i) for i in range(count)]
        tensors = [GraphTensor(graph, op.name, len(op.output_desc) + i) for i in range(len(names))]
        for name in names:
            write_desc(op.output_desc.add(), name, None, None)
        results.append(tensors[0] if count is None else tensors)
    return results[0] if len(results) == 1 else tuple(results)


def _lookup_prototype(op_type: str, checker: Checker) -> OpPrototype:
    try:
        return op_for_type(op_type).prototype
    except KeyError as error:
        checker.fail(f"unknown op type: {error.args[0]}")


def _check_input_names(proto: OpPrototype, inputs: Mapping, checker: Checker) -> None:
    known = proto.input_names()
    for name in inputs:
        if name not in known:
            checker.fail(f"unknown input {name!r}; the prototype's inputs are {known}")
    for arg in proto.inputs:
        if arg.presence != "optional" and inputs.get(arg.name) is None:
            checker.fail(f"required input {arg.name!r} is missing")


def _check_output_names(proto: OpPrototype, outputs: Sequence, checker: Checker) -> list[int | None]:
    """The count of each prototype output: None for a plain one, n >= 1 for a dynamic one given as (name, n)."""
    expected = [arg.name if arg.presence != "dynamic" else (arg.name, "n") for arg in proto.outputs]
    counts = []
    for arg, given in zip(proto.outputs, outputs, strict=False):
        if arg.presence != "dynamic" and given == arg.name:
            counts.append(None)
        elif (arg.presence == "dynamic" and isinstance(given, (tuple, list)) and len(given) == 2
              and given[0] == arg.name and isinstance(given[1], int) and given[1] >= 1):
            counts.append(given[1])
    if len(counts) != len(proto.outputs) or len(outputs) != len(proto.outputs):
        checker.fail(f"outputs must be the prototype's {expected} in order (n >= 1 for a dynamic output), "
                     f"got {list(outputs)}")
    return counts


def _check_attrs(proto: OpPrototype, attrs: Mapping, checker: Checker) -> None:
    kinds = {arg.name: arg.kind for arg in proto.attrs}
    for name, value in attrs.items():
        if name not in kinds:
            checker.fail(f"unknown attribute {name!r}; the prototype has {sorted(kinds)}")
        if not isinstance(value, attr.AttrValue):
            checker.fail(f"attribute {name!r} must be a ge.attr.{kinds[name]}, got {type(value).__name__} {value!r}")
        if value.kind != kinds[name]:
            checker.fail(f"attribute {name!r} must be {kinds[name]}, got ge.attr.{value.kind}({value.value!r})")


def _write_input(graph: Graph, op: OpDef, arg: TensorArg, given, checker: Checker) -> None:
    """One `input` entry and one input_desc named after the prototype input ("" and DT_UNDEFINED if absent);
    for a dynamic input, one per tensor of the list, numbered."""
    if given is None:
        op.input.append("")
        write_desc(op.input_desc.add(), arg.name, None, None)
        return
    if arg.presence == "dynamic":
        if not isinstance(given, (list, tuple)) or len(given) == 0:
            checker.fail(f"dynamic input {arg.name!r} must be a non-empty list of graph tensors, got {given!r}")
        named = [(dynamic_desc_name(arg.name, i), tensor) for i, tensor in enumerate(given)]
    else:
        named = [(arg.name, given)]
    for name, tensor in named:
        if not isinstance(tensor, GraphTensor) or tensor.graph is not graph:
            checker.fail(f"input {name!r} must be a tensor of the open graph {graph.name!r}, got {tensor!r}")
        op.input.append(tensor.ref)
        desc = op.input_desc.add()
        desc.CopyFrom(tensor.desc)
        desc.name = name


__all__ = [
    "GE_TO_TORCH_DTYPE",
    "TORCH_TO_GE_DTYPE",
    "UNKNOWN_DIM",
    "Data",
    "Graph",
    "GraphBuildError",
    "GraphTensor",
    "NetOutput",
    "attr",
    "current_graph",
    "custom_op",
    "dynamic_desc_name",
    "ge_dtype",
    "set_traced_meta",
    "torch_dtype",
]
