"""A local Graph Engine: compiles a `ge.proto` GraphDef the way GE does and runs it on the host.

Compile (once per graph), per node in order:
    Data        -> graph input `index`, its output desc as declared
    custom op   -> the registry's op by `type` (ge_plugin/ops.py): its prototype; inputs bound by the
                   prototype's names and order; attributes
                   read back from their AttrDef fields, defaults for absent ones;
                   InferDataType + InferShape (unknown dims stay -1) fill `output_desc`, checked
                   against what torch traced when that was recorded; TilingParse once per node
    NetOutput   -> the graph's results
Run (every call), per custom-op node:
    inputs made contiguous -> the runtime's plan for the actual shapes (InferShape + Tiling,
    cached per signature, as eager) -> outputs and workspace from the node's BufferPool -> the
    kernel, through the very `HostRuntime.run_kernel` the eager op uses (op_kernel.launcher).
A graph of one op fed by its Data nodes (what the backend builds) runs, where the ops' C++
entry is built, through its GraphNode instead: the first call of each input signature is
checked and planned here as above, the plan's launch record and buffers then kept in C++
(reused by the same rule) and repeats run without Python, on the same kernels.

Reference outputs (an output named as an input, e.g. BlockAttnResUpdate's partial_block): as in
GE, the output is the input's memory. The kernel is given the input as that output, as the eager op
gives it (through a contiguous copy, copied back after, where the fed tensor is not contiguous), so
the very tensor fed for that input, a caller's own, holds the bits the eager op leaves, and that
tensor is the node's output. InferShape must give the reference output the input's dtype and
dims, no other input of the node may come from the same tensor, and at run time none may share
memory with the updated one (the eager op's check). The C++ GraphNode writes a contiguous fed
tensor in place too; a call whose fed tensor is not contiguous, or shares memory with another input,
runs in Python (the copy back, or the error).

Errors in the user's shapes raise AttnResInputError naming the node; a disagreement between
torch's traced outputs and InferShape is a GraphCompileError (a bug in one of the two).
"""

from __future__ import annotations

import functools
import itertools
import os
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from google.protobuf import text_format

from attnres_ge.ge_plugin import cpp_entry, ge_attr
from attnres_ge.ge_plugin.ge import static_dims, torch_dtype, write_desc
from attnres_ge.ge_plugin.ge_ir import DT_UNDEFINED, GraphDef, OpDef, TensorDescriptor
from attnres_ge.ge_plugin.ops import op_for_type
from attnres_ge.ge_plugin.references import check_references_not_aliased, publish_reference_update
from attnres_ge.op_host.tiling_base import CompileInfo
from attnres_ge.op_kernel import OpKernel
from attnres_ge.op_kernel.buffer_pool import BufferPool
from attnres_ge.op_kernel.host_memory import huge_page_min_bytes
from attnres_ge.op_kernel.launcher import HostRuntime, ShapePlan, default_runtime
from attnres_ge.op_proto import WHERE_GRAPH, WHERE_PROTOTYPE, AttnResInputError, OpPrototype, TensorMeta
from attnres_ge.op_proto.op_def import is_unknown_rank

# With the ops' C++ entry, a compiled node of one op runs its planned signatures without Python.
GraphNode = cpp_entry.MODULE.GraphNode if cpp_entry.MODULE is not None else None

DATA, NET_OUTPUT = "Data", "NetOutput"


class GraphCompileError(RuntimeError):
    """The graph is malformed, or torch's traced outputs disagree with InferShape (a bug report)."""


class GraphRunError(ValueError):
    """The tensors fed to a compiled graph do not match its Data descs."""


def _node_error(op: OpDef, error: Exception) -> AttnResInputError:
    return AttnResInputError(f"node {op.name!r} (type {op.type}): {error}")


def parse_ref(ref: str) -> tuple[str, int]:
    """"producer:index" -> (producer, index)."""
    producer, _, index = ref.rpartition(":")
    if not producer or not index.isdigit():
        raise GraphCompileError(f"tensor reference {ref!r} is not 'node:index'")
    return producer, int(index)


def desc_meta(desc: TensorDescriptor) -> TensorMeta:
    """What InferShape sees of a desc: dims as stored (-1 unknown) and the torch dtype."""
    return TensorMeta(tuple(desc.shape.dim), torch_dtype(desc.dtype))


@dataclass
class CompiledOp:
    """A custom-op node after compile: everything a run needs but the tensors."""

    op_def: OpDef
    kernel: OpKernel
    attrs: dict
    sources: list[tuple[str, int] | None]  # producer of each prototype input, None when absent
    compile_info: CompileInfo
    references: tuple[tuple[int, int], ...] = ()  # (output index, input index) of each reference output
    buffers: BufferPool = field(default_factory=BufferPool)

    @property
    def prototype(self) -> OpPrototype:
        return self.kernel.prototype


class CompiledGraph:
    """A compiled GraphDef; call it with the graph inputs in Data index order, get NetOutput's tensors."""

    def __init__(self, graph_def: GraphDef, runtime: HostRuntime):
        self.graph_def = graph_def
        self.runtime = runtime
        self.data_ops: dict[int, tuple[OpDef, TensorMeta]] = {}  # index -> (Data node, its declared output)
        self.ops: list[CompiledOp] = []
        self.results: list[tuple[str, int]] = []
        self.node = None  # the C++ entry's GraphNode running this graph, when it can (see _cpp_graph_node)

    def __call__(self, *inputs: torch.Tensor) -> list[torch.Tensor]:
        if self.node is not None:
            try:
                return self.node(inputs)
            except TypeError:  # an input the C++ node cannot take as a tensor: name it
                self._bind_data(inputs)
                raise
        return self.run(inputs)

    def run(self, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """One run in Python: every node planned (cached per signature), its buffers from its BufferPool."""
        values = self._bind_data(inputs)
        for op in self.ops:
            args = [None if source is None else values[source] for source in op.sources]
            for index, output in enumerate(self._run_op(op, args)):
                values[(op.op_def.name, index)] = output
        return [values[ref] for ref in self.results]

    def plan_single_op(self, inputs: Sequence[torch.Tensor]) -> tuple | None:
        """For the C++ GraphNode: these inputs checked and planned as a run would; the repeatable launch."""
        op = self.ops[0]
        values = self._bind_data(inputs)
        return self._plan(op, [values[source].contiguous() for source in op.sources]).repeatable_launch()

    def _bind_data(self, inputs: Sequence[torch.Tensor]) -> dict[tuple[str, int], torch.Tensor]:
        if len(inputs) != len(self.data_ops):
            raise GraphRunError(f"graph {self.graph_def.name!r} takes {len(self.data_ops)} inputs, got {len(inputs)}")
        values = {}
        for index, (op, declared) in self.data_ops.items():
            tensor = inputs[index]
            if not isinstance(tensor, torch.Tensor):
                got = "None" if tensor is None else type(tensor).__name__
                raise GraphRunError(f"graph {self.graph_def.name!r} input {index} (node {op.name!r}) must be a "
                                    f"{declared.dtype} tensor {list(declared.shape)}, got {got}")
            if tensor.dtype != declared.dtype or not (
                tensor.shape == declared.shape or _known_dims_match(tensor.shape, declared.shape)
            ):
                raise GraphRunError(f"graph {self.graph_def.name!r} input {index} (node {op.name!r}) must be "
                                    f"{declared.dtype} {list(declared.shape)}, got {tensor.dtype} {list(tensor.shape)}")
            values[(op.name, 0)] = tensor
        return values

    def _run_op(self, op: CompiledOp, args: list[torch.Tensor | None]) -> list[torch.Tensor]:
        """The runtime's plan for these shapes (InferShape + Tiling, cached), buffers, the kernel."""
        tensors = [arg.contiguous() for arg in args]
        plan = self._plan(op, tensors)
        if not op.references:
            outputs, workspace = op.buffers.take(plan, plan.outputs, plan.tiling.workspace_size, tensors[0].device)
            self.runtime.run_kernel(plan, tensors, outputs, workspace)
            return outputs
        return self._run_op_in_place(op, plan, args, tensors)

    def _run_op_in_place(self, op: CompiledOp, plan: ShapePlan, args: list, tensors: list) -> list[torch.Tensor]:
        """A node with reference outputs, as the eager op runs it: the kernel writes each into its input
        (the contiguous copy where the fed tensor is not contiguous, copied back after), which is the output."""
        try:  # as eager refuses it: the kernel would read what it has already overwritten
            check_references_not_aliased(op.prototype, args, WHERE_GRAPH)
        except AttnResInputError as error:
            raise _node_error(op.op_def, error) from None
        referenced = dict(op.references)  # output index -> input index
        fresh = [meta for index, meta in enumerate(plan.outputs) if index not in referenced]
        buffers, workspace = op.buffers.take(plan, fresh, plan.tiling.workspace_size, tensors[0].device)
        buffers = iter(buffers)
        outputs = [tensors[referenced[index]] if index in referenced else next(buffers)
                   for index in range(len(plan.outputs))]
        self.runtime.run_kernel(plan, tensors, outputs, workspace)
        for output_index, input_index in op.references:
            fed = args[input_index]
            publish_reference_update(fed, outputs[output_index])
            outputs[output_index] = fed
        return outputs

    def _plan(self, op: CompiledOp, tensors: Sequence[torch.Tensor]) -> ShapePlan:
        try:
            return self.runtime.plan(op.kernel, tensors, op.attrs, WHERE_GRAPH)
        except AttnResInputError as error:
            raise _node_error(op.op_def, error) from None


def _known_dims_match(shape: Sequence[int], declared: Sequence[int]) -> bool:
    """The same rank, and every dim the desc knows (>= 0) equal."""
    if len(shape) != len(declared):
        return False
    return all(want < 0 or have == want for have, want in zip(shape, declared, strict=True))


_dump_counter = itertools.count()


def compile_graph(
    graph_def: GraphDef, runtime: HostRuntime | None = None, dump_path: str | Path | None = None
) -> CompiledGraph:
    """Compile `graph_def` in place (output descs filled) and return the runnable graph.

    With `dump_path`, the compiled graph is also written there as
    `attnres_ge_<pid>_<n>_<graph name>.pbtxt`.
    """
    compiled = CompiledGraph(graph_def, runtime or default_runtime())
    descs: dict[tuple[str, int], TensorDescriptor] = {}
    for op in graph_def.op:
        if op.type == DATA:
            _compile_data(compiled, op, descs)
        elif op.type == NET_OUTPUT:
            compiled.results = _compile_net_output(op, descs)
        else:
            compiled.ops.append(_compile_custom_op(compiled.runtime, op, descs))
    compiled.node = _cpp_graph_node(compiled)
    if dump_path is not None:
        dump_graph(graph_def, dump_path)
    return compiled


def _cpp_graph_node(compiled: CompiledGraph):
    """The C++ entry's GraphNode for a graph of one custom op fed straight by its Data nodes and giving
    its outputs (what the backend's converters build); None for other graphs or without the entry.
    It runs a planned signature without Python, buffers reused by BufferPool's rule; it asks the
    graph to plan a new signature and runs the graph in Python when the Python kernels are active."""
    if GraphNode is None or len(compiled.ops) != 1:
        return None
    op = compiled.ops[0]
    data_index = {data.name: index for index, (data, _) in compiled.data_ops.items()}
    if any(source is None or source[0] not in data_index for source in op.sources):
        return None
    if any(producer != op.op_def.name for producer, _ in compiled.results):
        return None
    graph = weakref.proxy(compiled)  # the node must not keep its graph alive: a cycle through C++ is never freed
    return GraphNode(
        [data_index[producer] for producer, _ in op.sources],
        [index for _, index in compiled.results],
        functools.partial(CompiledGraph.plan_single_op, graph),
        functools.partial(CompiledGraph.run, graph),
        op.buffers.max_shapes,
        huge_page_min_bytes(),
    )


def dump_graph(graph_def: GraphDef, folder: str | Path) -> Path:
    """Write the GraphDef as protobuf text into `folder` (created if missing); returns the file."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"attnres_ge_{os.getpid()}_{next(_dump_counter):04d}_{graph_def.name}.pbtxt"
    path.write_text(text_format.MessageToString(graph_def), encoding="utf-8")
    return path


def _resolve(op: OpDef, ref: str, descs: Mapping) -> tuple[str, int]:
    source = parse_ref(ref)
    if source not in descs:
        raise GraphCompileError(f"node {op.name!r}: input {ref!r} is not produced by an earlier node")
    return source


def _compile_data(compiled: CompiledGraph, op: OpDef, descs: dict) -> None:
    if "index" not in op.attr or op.attr["index"].WhichOneof("value") != "i" or len(op.output_desc) != 1:
        raise GraphCompileError(f"Data node {op.name!r} needs an Int attr 'index' and one output desc")
    index = op.attr["index"].i
    if index in compiled.data_ops:
        raise GraphCompileError(f"Data nodes {compiled.data_ops[index][0].name!r} and {op.name!r} share index {index}")
    compiled.data_ops[index] = (op, desc_meta(op.output_desc[0]))
    descs[(op.name, 0)] = op.output_desc[0]


def _compile_net_output(op: OpDef, descs: Mapping) -> list[tuple[str, int]]:
    """The graph's results; NetOutput's input descs refreshed from their (now inferred) producers."""
    results = [_resolve(op, ref, descs) for ref in op.input]
    del op.input_desc[:]
    for position, source in enumerate(results):
        desc = op.input_desc.add()
        desc.CopyFrom(descs[source])
        desc.name = f"x{position}"
    return results


def _compile_custom_op(runtime: HostRuntime, op: OpDef, descs: dict) -> CompiledOp:
    try:
        kernel = op_for_type(op.type).kernel
    except KeyError as error:
        raise AttnResInputError(f"node {op.name!r} ({WHERE_PROTOTYPE}): {error.args[0]}") from None
    prototype = kernel.prototype
    sources, metas = _bind_inputs(op, prototype, descs)
    attrs = _bind_attrs(op, prototype)
    try:
        outputs = prototype.infer(metas, attrs, WHERE_GRAPH)
    except AttnResInputError as error:
        raise _node_error(op, error) from None
    _check_traced_outputs(op, prototype, outputs)
    references = _bind_references(op, prototype, sources, metas, outputs)
    for desc, name, meta in zip(op.output_desc, prototype.output_names(), outputs, strict=True):
        write_desc(desc, name, meta.dtype, meta.shape)
    return CompiledOp(op, kernel, attrs, sources, runtime.compile_info(kernel), references)


def _bind_references(op: OpDef, prototype: OpPrototype, sources: Sequence, metas: Mapping,
                     outputs: Sequence[TensorMeta]) -> tuple[tuple[int, int], ...]:
    """(output index, input index) of each reference output, checked: the input is present and fed by a
    tensor no other input of the node reads (GE would write it under that input), and InferShape gives the
    output exactly the input's dtype and dims (it is the input's memory)."""
    output_names, input_names = prototype.output_names(), prototype.input_names()
    references = []
    for name in prototype.reference_outputs():
        output_index, input_index = output_names.index(name), input_names.index(name)
        source = sources[input_index]
        if source is None:
            raise AttnResInputError(f"node {op.name!r} ({WHERE_GRAPH}): {op.type} input {name!r} is updated in "
                                    "place (a reference output) and must be given")
        shared = [other for other, other_source in zip(input_names, sources, strict=True)
                  if other != name and other_source == source]
        if shared:
            raise AttnResInputError(
                f"node {op.name!r} ({WHERE_GRAPH}): {op.type} updates {name!r} in place, so it must not be the "
                f"tensor that {' and '.join(repr(other) for other in shared)} reads; expected distinct tensors, "
                f"got {op.input[input_index]} for each")
        fed, inferred = metas[name], outputs[output_index]
        dims_differ = not is_unknown_rank(fed.shape) and tuple(fed.shape) != static_dims(inferred.shape)
        if fed.dtype != inferred.dtype or dims_differ:
            raise GraphCompileError(
                f"node {op.name!r} ({op.type}): reference output {name!r} must be its input's "
                f"{fed.dtype} {list(fed.shape)}, InferShape gives {inferred.dtype} "
                f"{list(static_dims(inferred.shape))}; please report this")
        references.append((output_index, input_index))
    return tuple(references)


def _bind_inputs(op: OpDef, prototype: OpPrototype, descs: Mapping):
    """Producer and TensorMeta of each prototype input; the node's input_desc refreshed from its producer."""
    names = [desc.name for desc in op.input_desc]
    if names != prototype.input_names() or len(op.input) != len(names):
        raise AttnResInputError(f"node {op.name!r} ({WHERE_PROTOTYPE}): inputs must be {prototype.input_names()} "
                                f"in order, got input_desc {names} with {len(op.input)} inputs")
    sources, metas = [], {}
    for arg, ref, desc in zip(prototype.inputs, op.input, op.input_desc, strict=True):
        if ref == "":
            if arg.presence != "optional":
                raise AttnResInputError(f"node {op.name!r} ({WHERE_PROTOTYPE}): required input {arg.name!r} "
                                        "is absent")
            sources.append(None)
            continue
        source = _resolve(op, ref, descs)
        desc.CopyFrom(descs[source])
        desc.name = arg.name
        if desc.dtype == DT_UNDEFINED:
            raise GraphCompileError(f"node {op.name!r}: input {arg.name!r} ({ref}) has no dtype")
        sources.append(source)
        metas[arg.name] = desc_meta(desc)
    for index, desc in enumerate(op.output_desc):
        descs[(op.name, index)] = desc
    return sources, metas


def _bind_attrs(op: OpDef, prototype: OpPrototype) -> dict:
    """Attribute values read from their AttrDef fields, type-checked, defaults filled in."""
    kinds = {arg.name: arg.kind for arg in prototype.attrs}
    given = {}
    for name, attr_def in op.attr.items():
        if name.startswith("_") and name not in kinds:
            continue  # GE's private attributes (torchair writes _input_name_key, _inference_rule, ...)
        try:
            value = ge_attr.read(attr_def)
        except ValueError as error:
            raise _node_error(op, error) from None
        if name in kinds and value.kind != kinds[name]:
            raise AttnResInputError(f"node {op.name!r} ({WHERE_PROTOTYPE}): attribute {name!r} must be "
                                    f"{kinds[name]}, got {value.kind} {value.value!r}")
        given[name] = value.value
    try:
        return prototype.bind_attrs(given, WHERE_PROTOTYPE)
    except AttnResInputError as error:
        raise _node_error(op, error) from None


def _check_traced_outputs(op: OpDef, prototype: OpPrototype, inferred: Sequence[TensorMeta]) -> None:
    """Where torch recorded the outputs it traced, InferShape must agree (dtype; every dim both know)."""
    if len(op.output_desc) != len(prototype.outputs):
        raise GraphCompileError(f"node {op.name!r}: {len(op.output_desc)} output descs, the prototype has "
                                f"{prototype.output_names()}")
    for desc, meta in zip(op.output_desc, inferred, strict=True):
        if desc.dtype == DT_UNDEFINED:
            continue
        traced = desc_meta(desc)
        inferred_dims = static_dims(meta.shape)
        dims_agree = not desc.HasField("shape") or (  # torchair records the dtype only
            len(traced.shape) == len(inferred_dims)
            and all(a < 0 or b < 0 or a == b for a, b in zip(traced.shape, inferred_dims, strict=True))
        )
        if traced.dtype != meta.dtype or not dims_agree:
            raise GraphCompileError(
                f"node {op.name!r} ({op.type}) output {desc.name!r}: torch traced {traced.dtype} "
                f"{list(traced.shape)} but InferShape gives {meta.dtype} {list(inferred_dims)}; "
                "the fake tensor function and the prototype disagree, please report this"
            )
