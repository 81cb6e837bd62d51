"""Test-only stand-in for torchair's native module `torchair.core._torchair` (CANN's GE bindings).

torchair, as shipped inside the torch_npu wheel, is pure Python except this module. With the
stand-in installed as `sys.modules["torchair.core._torchair"]` before `import torchair`, the real
torchair front end runs on a CPU:

    torch.compile(fn, backend=torchair.get_npu_backend())
      -> torchair's converters build a `ge.proto` ModelDef
      -> TorchNpuGraphBase.load(serialized ModelDef, options, placements, output dtypes, executor)
         set_hint_shape(...), compile(), run((inputs, assigned_outputs, stream))

What the stand-in does instead of GE:
- `get_registered_ir_def(op_type)` answers from the project's prototype registry
  (the op registry, attnres_ge.ge_plugin.ops), so torchair's positional `ge.custom_op` and its automatic
  converter validate against our declarations;
- every graph torchair loads is recorded in `LOADED` (a `LoadedGraph`);
- `run` executes the graph on the project's local GE when it holds only Data, our ops and
  NetOutput (after dropping the nodes nothing consumes, as GE does; a TensorMove of an input, which
  torchair puts before an op updating that input in place, by feeding a copy of the input), writes
  each output into the tensor torchair assigned to it (an updated input's own); meta inputs carry no
  values, so they get meta outputs of our prototypes' InferShape; any other graph raises
  `CaptureOnlyError`.

Which torchair internals this relies on is listed in `_torchair_stub_notes.md`.
"""

from __future__ import annotations

import enum
import sys
import types
from dataclasses import dataclass, field

import torch

from attnres_ge.ge_plugin.ge_ir import ModelDef
from attnres_ge.ge_plugin.local_ge import compile_graph
from attnres_ge.ge_plugin.ops import OPS
from attnres_ge.op_proto import TensorMeta

PROTOTYPES = {op.op_type: op.prototype for op in OPS}

MODULE_NAME = "torchair.core._torchair"
STATUS_OK = "SUCCESS"
STATUS_NOT_REGISTERED = "ERROR"  # torchair: "No AscendIR <type> was found to be registered"
VALUE_TYPES = {"Int": "VT_INT", "Float": "VT_FLOAT", "Bool": "VT_BOOL", "Str": "VT_STRING"}
TENSOR_MOVE = "TensorMove"  # GE's copy; torchair emits one per input an op updates in place
RUNNABLE_FRAME = ("Data", "NetOutput")


LOADED: list[LoadedGraph] = []  # one per graph torchair hands to load(), in order
IR_QUERIES: list[str] = []  # op types asked of get_registered_ir_def, in order


class CaptureOnlyError(RuntimeError):
    """run() of a graph the local GE cannot execute."""


class TorchDataType(enum.IntEnum):
    """Read by torchair.llm_datadist at import time only; the values are not used on this path."""

    BOOL = 0
    UINT8 = 1
    INT8 = 2
    INT16 = 3
    UINT16 = 4
    INT32 = 5
    UINT32 = 6
    INT64 = 7
    UINT64 = 8
    BF16 = 9
    FLOAT16 = 10
    FLOAT32 = 11
    FLOAT64 = 12
    COMPLEX64 = 13
    COMPLEX128 = 14


@dataclass
class LoadedGraph:
    """What torchair handed to one TorchNpuGraph, and how often it ran."""

    name: str
    model_def_bytes: bytes = b""
    options: dict = field(default_factory=dict)
    input_placements: list = field(default_factory=list)  # per Data: 0 = host/CPU, 1 = device/NPU
    output_dtypes: list = field(default_factory=list)  # per NetOutput input, ge::DataType numbering
    executor_type: int = -1
    hint_input_shapes: list | None = None
    hint_output_shapes: list | None = None
    compiled: int = 0
    runs: int = 0

    @property
    def graph(self):
        """graph[0] of the ModelDef, parsed with torchair's own `ge.proto` messages."""
        from torchair._ge_concrete_graph.ge_ir_pb2 import ModelDef

        return ModelDef.FromString(self.model_def_bytes).graph[0]

    def op_types(self) -> list[str]:
        return [op.type for op in self.graph.op]

    def ops_of_type(self, op_type: str) -> list:
        return [op for op in self.graph.op if op.type == op_type]


class TorchNpuGraphBase:
    """Base of torchair.core._backend.TorchNpuGraph: one per GE graph (forward and backward apart)."""

    def __init__(self, name: str = ""):
        self.loaded = LoadedGraph(name=str(name))
        self._local_graph = None  # compiled on the local GE at the first run with values

    def load(self, serialized_model_def, options, input_placements, output_dtypes, executor_type):
        # The two lists arrive as protobuf repeated containers owned by torchair's graph: copy them.
        loaded = self.loaded
        loaded.model_def_bytes = bytes(serialized_model_def)
        loaded.options = dict(options)
        loaded.input_placements = list(input_placements)
        loaded.output_dtypes = list(output_dtypes)
        loaded.executor_type = int(executor_type)
        LOADED.append(loaded)

    def set_hint_shape(self, input_shapes, output_shapes):
        self.loaded.hint_input_shapes = [list(shape) for shape in input_shapes]
        self.loaded.hint_output_shapes = [list(shape) for shape in output_shapes]

    def compile(self):
        self.loaded.compiled += 1

    def auto_tune(self, args):
        raise CaptureOnlyError("torchair stand-in: auto_tune (AOE) needs CANN; this stand-in only captures graphs")

    def run(self, args):
        inputs, assigned_outputs, _stream = args  # torchair passes one tuple
        self.loaded.runs += 1
        if inputs and all(tensor.device.type == "meta" for tensor in inputs):
            return meta_outputs(self.loaded, list(inputs))
        if self._local_graph is None:
            graph_def = runnable_graph(self.loaded)
            self._moved = moved_inputs(graph_def)
            self._local_graph = compile_graph(without_tensor_moves(graph_def))
        inputs = [tensor.clone() if index in self._moved else tensor for index, tensor in enumerate(inputs)]
        return assign(list(self._local_graph(*inputs)), assigned_outputs)


def assign(results: list[torch.Tensor], assigned_outputs) -> list[torch.Tensor]:
    """GE writes an output into the tensor torchair assigned to it, if any: torchair assigns the caller's
    tensor to an output that is an input's new value (an input updated in place, e.g. BlockAttnResUpdate's
    partial_block), and that tensor is the output."""
    for index, target in enumerate(assigned_outputs or ()):
        if target is not None:
            target.copy_(results[index])
            results[index] = target
    return results


# ge::DataType numbers of the float outputs torchair declares at load (LoadedGraph.output_dtypes).
GE_FLOAT_DTYPES = {0: torch.float32, 1: torch.float16, 27: torch.bfloat16}


def meta_outputs(loaded: LoadedGraph, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    """Meta inputs carry no values: each node's outputs are meta tensors of its prototype's InferShape. A graph
    holding CANN's own ops (e.g. the read's Pack and RmsNorm) gets the outputs torchair declared for it (its
    static hint shapes and output dtypes), so that a training step's backward graph is built too."""
    try:
        graph_def = runnable_graph(loaded)
    except CaptureOnlyError:
        if loaded.hint_output_shapes is None or any(dim < 0 for s in loaded.hint_output_shapes for dim in s):
            raise
        return [torch.empty(shape, dtype=GE_FLOAT_DTYPES[dtype], device="meta")
                for shape, dtype in zip(loaded.hint_output_shapes, loaded.output_dtypes, strict=True)]
    moved_inputs(graph_def)  # the same graphs are refused as in a run with values
    graph_def = without_tensor_moves(graph_def)
    values = {(op.name, 0): inputs[op.attr["index"].i] for op in graph_def.op if op.type == "Data"}
    for op in graph_def.op:
        if op.type in PROTOTYPES:
            proto = PROTOTYPES[op.type]
            given = zip(proto.inputs, op.input, strict=True)
            metas = {arg.name: TensorMeta.of(values[_source(ref)]) for arg, ref in given if ref}
            attrs = {name: getattr(value, value.WhichOneof("value")) for name, value in op.attr.items()
                     if not name.startswith("_")}
            for index, meta in enumerate(proto.infer(metas, attrs, "torchair stand-in, meta run")):
                values[(op.name, index)] = torch.empty(meta.shape, dtype=meta.dtype, device="meta")
    net_output = next(op for op in graph_def.op if op.type == "NetOutput")
    return [values[_source(ref)] for ref in net_output.input]


def _source(ref: str) -> tuple[str, int]:
    name, _, index = ref.rpartition(":")
    return name, int(index)


def runnable_graph(loaded: LoadedGraph):
    """graph[0] parsed with the project's own ge.proto, dead nodes dropped; CaptureOnlyError unless it is all ours."""
    graph_def = without_identities(live_graph(ModelDef.FromString(loaded.model_def_bytes).graph[0]))
    foreign = sorted({op.type for op in graph_def.op
                      if op.type not in (*RUNNABLE_FRAME, TENSOR_MOVE) and op.type not in PROTOTYPES})
    if foreign:
        raise CaptureOnlyError(
            f"torchair stand-in only captures graph {loaded.name!r}: it holds {foreign}, and only graphs of "
            f"Data, {', '.join(sorted(PROTOTYPES))} and NetOutput can run here"
        )
    return graph_def


def moved_inputs(graph_def) -> set[int]:
    """Data indices read through a TensorMove (GE's copy of a tensor): torchair moves each input that an
    op updates in place (auto_functionalized_v2's clone of its base, e.g. BlockAttnResUpdate's
    partial_block). The run feeds a copy of such an input instead, which is faithful only while the
    TensorMove is the Data's one reader: CaptureOnlyError otherwise."""
    readers: dict[str, list[str]] = {}
    for op in graph_def.op:
        for ref in op.input:
            readers.setdefault(ref.lstrip("^").rpartition(":")[0], []).append(op.type)
    moved = set()
    for op in graph_def.op:
        if op.type == "Data" and TENSOR_MOVE in readers.get(op.name, ()):
            if readers[op.name] != [TENSOR_MOVE]:
                raise CaptureOnlyError(f"torchair stand-in: Data {op.name!r} is read by {readers[op.name]}; "
                                       "only a Data read by one TensorMove alone can run here")
            moved.add(op.attr["index"].i)
    if any(op.type == TENSOR_MOVE and _source(op.input[0])[0] not in _data_names(graph_def) for op in graph_def.op):
        raise CaptureOnlyError("torchair stand-in: only a TensorMove of a graph input can run here")
    return moved


def _data_names(graph_def) -> set[str]:
    return {op.name for op in graph_def.op if op.type == "Data"}


def without_tensor_moves(graph_def):
    """TensorMove ops of graph inputs bypassed and dropped: the run feeds those inputs as copies (moved_inputs)."""
    moves = {op.name: op.input[0] for op in graph_def.op if op.type == TENSOR_MOVE}
    kept = [op for op in graph_def.op if op.type != TENSOR_MOVE]
    for op in kept:
        rewired = [moves.get(_source(ref)[0], ref) if ref and not ref.startswith("^") else ref for ref in op.input]
        del op.input[:]
        op.input.extend(rewired)
    del graph_def.op[:]
    graph_def.op.extend(kept)
    return graph_def


def without_identities(graph_def):
    """Identity ops bypassed and dropped, as GE's graph passes do. torchair emits one per aten.detach, which
    AOTAutograd puts on every saved output that requires grad (the forward's statistics, differentiable for
    second-order gradients)."""
    identities = {op.name: op.input[0] for op in graph_def.op if op.type == "Identity"}

    def source(ref: str) -> str:
        name, _, _ = ref.rpartition(":")
        while name in identities:
            ref = identities[name]
            name, _, _ = ref.rpartition(":")
        return ref

    kept = [op for op in graph_def.op if op.type != "Identity"]
    for op in kept:
        rewired = [ref if ref.startswith("^") or not ref else source(ref) for ref in op.input]
        del op.input[:]
        op.input.extend(rewired)
    del graph_def.op[:]
    graph_def.op.extend(kept)
    return graph_def


def live_graph(graph_def):
    """Drop the ops NetOutput does not need, as GE's dead-node pass does; Data ops always stay.

    With symbolic shapes torchair emits Shape -> Gather chains for every symbolic input dim
    whether or not anything consumes them.
    """
    producers = {op.name: op for op in graph_def.op}
    live = {op.name for op in graph_def.op if op.type in RUNNABLE_FRAME}
    pending = [op for op in graph_def.op if op.type == "NetOutput"]
    while pending:
        for ref in pending.pop().input:
            name = ref.lstrip("^").rpartition(":")[0] or ref.lstrip("^")
            if ref and name not in live:
                live.add(name)
                pending.append(producers[name])
    kept = [op for op in graph_def.op if op.name in live]
    del graph_def.op[:]
    graph_def.op.extend(kept)
    return graph_def


def get_registered_ir_def(op_type: str):
    """(status, inputs, outputs, attrs) of a GE op type, from the op registry (attnres_ge.ge_plugin.ops)."""
    IR_QUERIES.append(op_type)
    proto = PROTOTYPES.get(op_type)
    if proto is None:
        return STATUS_NOT_REGISTERED, [], [], []
    inputs = [(arg.name, arg.presence) for arg in proto.inputs]
    # GE's IR comes from REG_OP, which has no optional output: an OpDef's optional output reads "required".
    outputs = [(arg.name, "dynamic" if arg.presence == "dynamic" else "required") for arg in proto.outputs]
    attrs = [(attr.name, VALUE_TYPES[attr.kind]) for attr in proto.attrs]
    return STATUS_OK, inputs, outputs, attrs


def _initialize_graph_engine(options):
    return None  # options: dict[str, str] such as {"ge.exec.deviceId": "0", ...}


def _finalize_graph_engine():
    return None  # torchair registers this with atexit


def install() -> types.ModuleType:
    """Put the stand-in at sys.modules["torchair.core._torchair"]; must run before any torchair import."""
    if any(name == "torchair" or name.startswith("torchair.") for name in sys.modules if name != MODULE_NAME):
        raise RuntimeError("torchair stand-in: install() must run before torchair is imported")
    module = types.ModuleType(MODULE_NAME, __doc__)
    module.TorchDataType = TorchDataType
    module.TorchNpuGraphBase = TorchNpuGraphBase
    module.InitializeGraphEngine = _initialize_graph_engine
    module.FinalizeGraphEngine = _finalize_graph_engine
    module.get_registered_ir_def = get_registered_ir_def
    sys.modules[MODULE_NAME] = module
    return module
