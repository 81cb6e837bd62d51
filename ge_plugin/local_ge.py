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

Tensor ops (ops.TENSOR_OPS: the general read, whose kernels take a list of tensors where they lie, and
the update with a fused norm): a dynamic input binds its descs `sources0`, `sources1`, ... in order (GE's
naming), a dynamic output one desc per tensor likewise; a run validates the fed tensors by the prototype
and calls the op's TensorKernel, the very call its eager op makes, on the tensors as fed (no contiguous
copy, as eager; it writes a reference output into its fed input itself), so graph and eager agree bit for
bit. Such a node runs in Python (no GraphNode: nothing is planned).

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
from attnres_ge.ge_plugin.ge import dynamic_desc_name, static_dims, torch_dtype, write_desc
from attnres_ge.ge_plugin.ge_ir import DT_UNDEFINED, GraphDef, OpDef, TensorDescriptor
from attnres_ge.ge_plugin.ops import op_for_type
from attnres_ge.ge_plugin.references import check_references_not_aliased, publish_reference_update
from attnres_ge.op_host.tiling_base import CompileInfo
from attnres_ge.op_kernel import OpKernel
from attnres_ge.op_kernel.buffer_pool import BufferPool
from attnres_ge.op_kernel.host_memory import huge_page_min_bytes
from attnres_ge.op_kernel.kernel_spec import TensorKernel
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
    kernel: OpKernel | TensorKernel
    attrs: dict
    # Producer of each prototype input, None when absent, a list of them for a dynamic input.
    sources: list[tuple[str, int] | list[tuple[str, int]] | None]
    compile_info: CompileInfo | None  # TilingParse's result; None for a tensor op, which has no tiling
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
            args = [_fed(values, source) for source in op.sources]
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
        if isinstance(op.kernel, TensorKernel):
            return _run_tensor_op(op, args)
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


def _fed(values: Mapping, source):
    """What a node input receives: None (absent), a tensor, or a list of them (a dynamic input)."""
    if source is None:
        return None
    return [values[item] for item in source] if isinstance(source, list) else values[source]


def _run_tensor_op(op: CompiledOp, args: list) -> list[torch.Tensor]:
    """A tensor op's node: the fed tensors validated as eager validates them, then the kernel's own call;
    its outputs flattened in GE's order (a dynamic output's tensors in place of it)."""
    prototype = op.prototype
    try:
        attrs, metas = prototype.check(prototype.input_metas(args, WHERE_GRAPH), op.attrs, WHERE_GRAPH)
        check_references_not_aliased(prototype, args, WHERE_GRAPH)
    except AttnResInputError as error:
        raise _node_error(op.op_def, error) from None
    outputs = op.kernel.run(args, attrs, metas, cpp_entry.empty_output)
    for output_index, input_index in op.references:  # the kernel wrote them into the fed tensors
        publish_reference_update(args[input_index], outputs[output_index])
    return [tensor for output in outputs for tensor in (output if isinstance(output, list) else [output])]


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
    if GraphNode is None or len(compiled.ops) != 1 or compiled.ops[0].compile_info is None:
        return None  # a tensor op (no compile info) has no plan for the node to repeat
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
    outputs = _expand_outputs(op, prototype, sources, outputs)
    _check_traced_outputs(op, outputs)
    references = _bind_references(op, prototype, sources, metas, outputs)
    for desc, meta in zip(op.output_desc, outputs, strict=True):
        write_desc(desc, desc.name, meta.dtype, meta.shape)
    compile_info = None if isinstance(kernel, TensorKernel) else runtime.compile_info(kernel)
    return CompiledOp(op, kernel, attrs, sources, compile_info, references)


def _desc_counts(args: Sequence, names: Sequence[str]) -> list[int | None] | None:
    """How the descs `names` (in order) spell the prototype's `args`: None for a plain arg (one desc named as
    it), n >= 1 for a dynamic one (n descs numbered by GE: sources0, sources1, ...); None if they do not."""
    counts, position = [], 0
    for arg in args:
        if arg.presence != "dynamic":
            if position >= len(names) or names[position] != arg.name:
                return None
            counts.append(None)
            position += 1
            continue
        count = 0
        while position + count < len(names) and names[position + count] == dynamic_desc_name(arg.name, count):
            count += 1
        if count == 0:
            return None
        counts.append(count)
        position += count
    return counts if position == len(names) else None


def _spelled(args: Sequence) -> list[str]:
    """The prototype's args as the descs must name them, for an error message."""
    return [f"{dynamic_desc_name(arg.name, 0)}, {dynamic_desc_name(arg.name, 1)}, ..." if arg.presence == "dynamic"
            else arg.name for arg in args]


def _expand_outputs(op: OpDef, prototype: OpPrototype, sources: Sequence,
                    outputs: Sequence[TensorMeta]) -> list[TensorMeta]:
    """InferShape's outputs, one per output desc: a dynamic output's meta repeated for each of its descs, which
    must number as many as the tensors of the node's dynamic input (one gradient per source)."""
    counts = _desc_counts(prototype.outputs, [desc.name for desc in op.output_desc])
    if counts is None:
        raise AttnResInputError(f"node {op.name!r} ({WHERE_PROTOTYPE}): output descs must be "
                                f"{_spelled(prototype.outputs)} in order, got {[d.name for d in op.output_desc]}")
    listed = [len(source) for source in sources if isinstance(source, list)]
    for arg, count in zip(prototype.outputs, counts, strict=True):
        if count is not None and listed != [count]:
            raise AttnResInputError(f"node {op.name!r} ({WHERE_PROTOTYPE}): dynamic output {arg.name!r} must have "
                                    f"one tensor per tensor of the dynamic input, {listed}, got {count}")
    return [meta for meta, count in zip(outputs, counts, strict=True) for _ in range(count or 1)]


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
    """Producer and TensorMeta of each prototype input (lists of them for a dynamic input); the node's
    input_desc refreshed from its producers."""
    names = [desc.name for desc in op.input_desc]
    counts = _desc_counts(prototype.inputs, names)
    if counts is None or len(op.input) != len(names):
        raise AttnResInputError(f"node {op.name!r} ({WHERE_PROTOTYPE}): inputs must be {_spelled(prototype.inputs)} "
                                f"in order, got input_desc {names} with {len(op.input)} inputs")
    sources, metas, position = [], {}, 0
    for arg, count in zip(prototype.inputs, counts, strict=True):
        bound = [_bind_input(op, arg, position + i, descs) for i in range(count or 1)]
        position += count or 1
        if count is None:
            sources.append(bound[0] and bound[0][0])
            metas[arg.name] = bound[0] and bound[0][1]
        else:
            sources.append([source for source, _ in bound])
            metas[arg.name] = tuple(meta for _, meta in bound)
    for index, desc in enumerate(op.output_desc):
        descs[(op.name, index)] = desc
    return sources, metas  # None for an absent optional input, as eager's input_metas gives it


def _bind_input(op: OpDef, arg, index: int, descs: Mapping) -> tuple[tuple[str, int], TensorMeta] | None:
    """(producer, meta) of the node's input `index`, its desc refreshed; None for an absent optional input."""
    ref, desc = op.input[index], op.input_desc[index]
    if ref == "":
        if arg.presence != "optional":
            raise AttnResInputError(f"node {op.name!r} ({WHERE_PROTOTYPE}): required input {desc.name!r} is absent")
        return None
    source = _resolve(op, ref, descs)
    name = desc.name
    desc.CopyFrom(descs[source])
    desc.name = name
    if desc.dtype == DT_UNDEFINED:
        raise GraphCompileError(f"node {op.name!r}: input {name!r} ({ref}) has no dtype")
    return source, desc_meta(desc)


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


def _check_traced_outputs(op: OpDef, inferred: Sequence[TensorMeta]) -> None:
    """Where torch recorded the outputs it traced, InferShape must agree (dtype; every dim both know).
    `inferred`: one meta per output desc (_expand_outputs checked the descs against the prototype)."""
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
