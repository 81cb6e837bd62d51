"""Prototype: run the real torchair front end (from the torch_npu wheel) on a CPU.

torchair is pure Python except its native module ``torchair.core._torchair``
(CANN's Graph Engine bindings).  This script installs a small pure-Python
stand-in for that module, then drives the real converter pipeline:

    torch.compile(fn, backend=torchair.get_npu_backend())
      -> torchair converts the FX graph into a ge.proto ModelDef
      -> the stand-in's graph class receives it in load(), and we print it.

Scenarios (each prints the captured GraphDefs):
  1. keyword converter  ``torchair.ge.custom_op("DemoScale", inputs=..., outputs=..., attrs=...)``
     with meta inputs and with CPU inputs;
  2. positional converter ``torchair.ge.custom_op("DemoScale", x, bias, alpha)``
     (prototype looked up through get_registered_ir_def);
  3. no converter at all: torchair's automatic converter for custom ops;
  4. a training step (AOTAutograd: forward and backward graphs), dynamic=True.

Run (not a pytest file):

    TORCH_DEVICE_BACKEND_AUTOLOAD=0 /tmp/npuvenv/bin/python tests/interop/torchair_standin_prototype.py

Needs a venv with torch==2.13.0 (CPU), torch_npu==2.13.0 and protobuf.
"""

from __future__ import annotations

import enum
import os
import sys
import sysconfig
import types

if os.environ.get("TORCH_DEVICE_BACKEND_AUTOLOAD") != "0":
    sys.exit("set TORCH_DEVICE_BACKEND_AUTOLOAD=0: torch_npu's autoload makes `import torch` fail without CANN")

import torch  # noqa: E402

# --------------------------------------------------------------------------------------
# Prototype registry the stand-in answers get_registered_ir_def() from.
# Format (what torchair expects, see torchair/ge/ge_custom.py and
# torchair/_ge_concrete_graph/fx2ge_converter.py::_get_converter_context):
#   inputs:  [(name, "required" | "optional" | "dynamic"), ...]   in prototype order
#   outputs: [(name, "required" | "dynamic"), ...]
#   attrs:   [(name, "VT_INT" | "VT_FLOAT" | "VT_BOOL" | "VT_STRING" | "VT_DATA_TYPE"
#                   | "VT_LIST_INT" | "VT_LIST_FLOAT" | ...), ...]
# --------------------------------------------------------------------------------------
PROTOTYPES = {
    "DemoScale": (
        [("x", "required"), ("bias", "optional")],
        [("y", "required")],
        [("alpha", "VT_FLOAT"), ("flags", "VT_LIST_INT"), ("out_dtype", "VT_DATA_TYPE")],
    ),
    "DemoScaleGrad": (
        [("dy", "required"), ("x", "required")],
        [("dx", "required"), ("dbias", "required")],
        [("alpha", "VT_FLOAT")],
    ),
    # Looked up by torchair's automatic converter: op demo::auto_scale -> "AutoScale".
    "AutoScale": (
        [("x", "required"), ("others", "dynamic")],
        [("y", "required")],
        [("alpha", "VT_FLOAT"), ("repeat", "VT_INT")],
    ),
}


# --------------------------------------------------------------------------------------
# The stand-in for torchair.core._torchair
# --------------------------------------------------------------------------------------
class TorchDataType(enum.IntEnum):
    """Only referenced by torchair.llm_datadist at import time; values are arbitrary."""

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


LOADED = []  # one record (a dict) per graph torchair hands to load()
IR_QUERIES = []  # op types asked of get_registered_ir_def, in order


class TorchNpuGraphBase:
    """Base class of torchair.core._backend.TorchNpuGraph (one per GE graph)."""

    def __init__(self, name=""):
        self.record = {"name": name, "runs": 0}

    def load(self, serialized_model_def, options, input_placements, output_dtypes, executor_type):
        # input_placements / output_dtypes arrive as protobuf repeated containers: copy them.
        self.record.update(
            model_def=bytes(serialized_model_def),
            options=dict(options),
            input_placements=list(input_placements),
            output_dtypes=list(output_dtypes),
            executor_type=int(executor_type),
        )
        LOADED.append(self.record)
        if os.environ.get("STANDIN_DUMP_ON_LOAD") == "1":
            from torchair._ge_concrete_graph.ge_ir_pb2 import ModelDef

            graph = ModelDef.FromString(bytes(serialized_model_def)).graph[0]
            print(f"load({self.record['name']}):\n{_short_graph(graph)}")

    def set_hint_shape(self, input_shapes, output_shapes):
        self.record.update(hint_input_shapes=input_shapes, hint_output_shapes=output_shapes)

    def compile(self):
        return None

    def auto_tune(self, args):
        return None

    def run(self, args):
        inputs, assigned_outputs, stream = args
        self.record["runs"] += 1
        self.record["last_run_inputs"] = [(tuple(t.shape), t.dtype, t.device.type) for t in inputs]
        return _run_graph(self.record, inputs)


def get_registered_ir_def(op_type):
    IR_QUERIES.append(op_type)
    if op_type not in PROTOTYPES:
        return "ERROR", [], [], []  # "ERROR" = not registered; torchair also knows "None" = GE not loaded
    inputs, outputs, attrs = PROTOTYPES[op_type]
    return "SUCCESS", list(inputs), list(outputs), list(attrs)


def install_standin():
    """Make `import torchair` use the stand-in. Call before importing torchair."""
    dynamo_dir = os.path.join(sysconfig.get_paths()["purelib"], "torch_npu", "dynamo")
    if dynamo_dir not in sys.path:
        sys.path.insert(0, dynamo_dir)
    mod = types.ModuleType("torchair.core._torchair")
    mod.TorchDataType = TorchDataType
    mod.TorchNpuGraphBase = TorchNpuGraphBase
    mod.get_registered_ir_def = get_registered_ir_def
    mod.InitializeGraphEngine = lambda options: None  # options: dict[str, str]
    mod.FinalizeGraphEngine = lambda: None  # called from an atexit hook
    # Not reached by these scenarios (the five names above suffice); check_cann_compat is used by
    # torchair's built-in converters that pass an IrDef, SetDebugLogPath under TORCH_COMPILE_DEBUG=1.
    mod.check_cann_compat = lambda op_type, opt_inputs, opt_attrs: ""  # "" = compatible
    mod.SetDebugLogPath = lambda path: None  # TORCH_COMPILE_DEBUG=1
    sys.modules["torchair.core._torchair"] = mod


# --------------------------------------------------------------------------------------
# A tiny GraphDef interpreter so that run() can return real values for CPU inputs.
# --------------------------------------------------------------------------------------
_GE_TO_TORCH = {0: torch.float32, 1: torch.float16, 2: torch.int8, 3: torch.int32, 9: torch.int64,
                12: torch.bool, 11: torch.float64, 27: torch.bfloat16}  # ge::DataType numbering
_PROTO_TO_TORCH = {1: torch.float32, 2: torch.float16, 3: torch.int8, 7: torch.int32, 8: torch.int64,
                   11: torch.bool, 12: torch.float64, 27: torch.bfloat16}  # ge.proto.DataType numbering


def _demo_scale(x, bias, alpha):
    return x * alpha + (bias if bias is not None else 0)


def _run_graph(record, inputs):
    """Evaluate the graph's NetOutput on demand (ops nobody consumes are never run)."""
    from torchair._ge_concrete_graph.ge_ir_pb2 import ModelDef

    graph = ModelDef.FromString(record["model_def"]).graph[0]
    ops = {op.name: op for op in graph.op}
    values = {}

    def value(ref):
        if ref == "":
            return None  # absent optional input
        name, idx = ref.rsplit(":", 1)
        if name not in values:
            values[name] = evaluate(ops[name])
        return values[name][int(idx)]

    def evaluate(op):
        ins = [value(r) for r in op.input if not r.startswith("^")]  # "^name" would be a control edge
        a = op.attr
        if op.type == "Data":
            return [inputs[a["index"].i]]
        if op.type == "Const":
            t = a["value"].t
            dtype = _PROTO_TO_TORCH[t.desc.dtype]
            flat = torch.frombuffer(bytearray(t.data), dtype=dtype) if t.data else torch.zeros(0, dtype=dtype)
            return [flat.reshape(list(t.desc.shape.dim)).clone()]
        if op.type == "DemoScale":
            return [_demo_scale(ins[0], ins[1], a["alpha"].f)]
        if op.type == "AutoScale":  # inputs: x, then the dynamic list others0, others1, ...
            return [_demo_scale(ins[0], sum(ins[1:]) if len(ins) > 1 else None, a["alpha"].f)]
        if op.type == "DemoScaleGrad":
            dy, x = ins
            return [dy * a["alpha"].f, dy.clone()]
        if op.type in ("Add", "AddV2"):
            return [ins[0] + ins[1]]
        if op.type == "Mul":
            return [ins[0] * ins[1]]
        if op.type == "Cast":
            return [ins[0].to(_GE_TO_TORCH[a["dst_type"].i])]
        if op.type == "Shape":  # used with dynamic shapes: Shape -> Gather -> Pack gives sizes
            return [torch.tensor(ins[0].shape, dtype=_GE_TO_TORCH[a["dtype"].i] if "dtype" in a else torch.int64)]
        if op.type == "Gather":
            return [ins[0][ins[1].long()]]
        if op.type == "Pack":
            return [torch.stack(ins, dim=a["axis"].i if "axis" in a else 0)]
        if op.type == "BroadcastTo":
            return [ins[0].expand(ins[1].tolist()).clone()]
        if op.type in ("Identity", "TensorMove"):
            return [ins[0].clone()]
        if op.type == "ReduceSum":
            axes = ins[1].tolist() if ins[1].numel() else list(range(ins[0].dim()))
            return [ins[0].sum(dim=axes, keepdim=a["keep_dims"].b)]
        if op.type == "Fill":
            return [torch.full(ins[0].tolist(), ins[1].item(), dtype=ins[1].dtype, device=ins[1].device)]
        if op.type == "Expand":
            return [ins[0].expand(ins[1].tolist()).clone()]
        raise NotImplementedError(f"prototype interpreter: no rule for GE op type {op.type!r}")

    net_output = next(op for op in graph.op if op.type == "NetOutput")
    return [value(r) for r in net_output.input if not r.startswith("^")]


# --------------------------------------------------------------------------------------
# Printing what was captured
# --------------------------------------------------------------------------------------
_NOISE_ATTRS = ("_meta", "_fx_tensor_name", "_torchair_stack")
CUSTOM_OP_TYPES = ("DemoScale", "DemoScaleGrad", "AutoScale")


def _short_graph(graph) -> str:
    """GraphDef as protobuf text, minus the debugging attrs torchair puts on tensor descs.

    Ops other than the custom ones are shown on one line each (name, type, inputs)."""
    from torchair._ge_concrete_graph.ge_ir_pb2 import GraphDef

    g = GraphDef()
    g.CopyFrom(graph)
    lines = [f"name: {g.name!r}"]
    for op in g.op:
        for desc in list(op.input_desc) + list(op.output_desc):
            for key in _NOISE_ATTRS:
                if key in desc.attr:
                    del desc.attr[key]
        if op.type in CUSTOM_OP_TYPES or "--full" in sys.argv:
            lines.append("op {\n  " + str(op).rstrip().replace("\n", "\n  ") + "\n}")
        else:
            descs = [f"{d.name or '?'}:{d.dtype}{list(d.shape.dim)}@{d.device_type or '-'}" for d in op.output_desc]
            lines.append(f"op {op.name} ({op.type}) inputs={list(op.input)} outputs={descs}")
    for key, value in sorted(g.attr.items()):
        lines.append(f"graph attr {key}: {str(value).strip()}".replace("\n", " "))
    return "\n".join(lines)


def dump_loaded(title, since):
    from torchair._ge_concrete_graph.ge_ir_pb2 import ModelDef

    for rec in LOADED[since:]:
        model = ModelDef.FromString(rec["model_def"])
        print(f"\n===== {title}: graph {rec['name']!r} =====")
        print("input_placements:", rec["input_placements"], "(0 = host/CPU, 1 = device/NPU)")
        print("output_dtypes:   ", rec["output_dtypes"], "(ge::DataType numbering, DT_FLOAT = 0)")
        print("executor_type:   ", rec["executor_type"])
        print("hint shapes:     ", rec.get("hint_input_shapes"), "->", rec.get("hint_output_shapes"))
        print("options[ge.inputHintShape]:", rec["options"].get("ge.inputHintShape"))
        print("run inputs:      ", rec.get("last_run_inputs"))
        print("graphs in ModelDef:", len(model.graph), "; ops:", [f"{op.name}:{op.type}" for op in model.graph[0].op])
        print(_short_graph(model.graph[0]))


# --------------------------------------------------------------------------------------
# Scenarios
# --------------------------------------------------------------------------------------
def main():
    install_standin()
    import warnings

    import torchair

    # torchair imports its converters for torch_npu's own ops lazily (first graph with an op that
    # has no registered converter); without torch_npu each one warns. Import them once, quietly.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import torchair._ge_concrete_graph.ge_converter.custom  # noqa: F401
    from torchair import ge
    from torchair.ge import attr

    print("torchair:", torchair.__file__)
    import google.protobuf

    print("protobuf:", google.protobuf.__version__)

    # --- the custom ops ---------------------------------------------------------------
    @torch.library.custom_op("demo::demo_scale", mutates_args=())
    def demo_scale(x: torch.Tensor, bias: torch.Tensor | None, alpha: float) -> torch.Tensor:
        return _demo_scale(x, bias, alpha)

    @demo_scale.register_fake
    def _(x, bias, alpha):
        return torch.empty_like(x)

    @torch.library.custom_op("demo::demo_scale_grad", mutates_args=())
    def demo_scale_grad(dy: torch.Tensor, x: torch.Tensor, alpha: float) -> tuple[torch.Tensor, torch.Tensor]:
        return dy * alpha, dy.clone()

    @demo_scale_grad.register_fake
    def _(dy, x, alpha):
        return torch.empty_like(x), torch.empty_like(x)

    def setup_context(ctx, inputs, output):
        x, bias, alpha = inputs
        ctx.save_for_backward(x)
        ctx.alpha = alpha

    def backward(ctx, dy):
        (x,) = ctx.saved_tensors
        dx, dbias = torch.ops.demo.demo_scale_grad(dy, x, ctx.alpha)
        return dx, dbias, None

    demo_scale.register_autograd(backward, setup_context=setup_context)

    # No converter is registered for this one: torchair generates it (scenario 3).
    @torch.library.custom_op("demo::auto_scale", mutates_args=())
    def auto_scale(x: torch.Tensor, others: list[torch.Tensor], alpha: float, repeat: int) -> torch.Tensor:
        return _demo_scale(x, sum(others) if others else None, alpha)

    @auto_scale.register_fake
    def _(x, others, alpha, repeat):
        return torch.empty_like(x)

    # --- converters -------------------------------------------------------------------
    style = {"form": "keyword"}

    @torchair.register_fx_node_ge_converter(torch.ops.demo.demo_scale.default)
    def convert_demo_scale(x, bias, alpha, meta_outputs=None):
        # x, bias: torchair.ge Tensor (bias may be None); alpha: python float (or a
        # graph Tensor when it is symbolic); meta_outputs: TensorSpec of the result.
        if style["form"] == "keyword":
            return ge.custom_op(
                "DemoScale",
                inputs={"x": x, "bias": bias},
                outputs=["y"],
                attrs={"alpha": attr.Float(alpha), "flags": attr.ListInt([1, 2]), "out_dtype": attr.DataType(0)},
            )
        # positional: inputs then attrs, in prototype order (from get_registered_ir_def);
        # a torch.dtype attr value is converted to ge::DataType.
        return ge.custom_op("DemoScale", x, bias, alpha, [1, 2], torch.float32)

    @torchair.register_fx_node_ge_converter(torch.ops.demo.demo_scale_grad.default)
    def convert_demo_scale_grad(dy, x, alpha, meta_outputs=None):
        return ge.custom_op(
            "DemoScaleGrad",
            inputs={"dy": dy, "x": x},
            outputs=["dx", "dbias"],
            attrs={"alpha": attr.Float(alpha)},
        )

    backend = torchair.get_npu_backend()

    # 1. keyword form, meta inputs then CPU inputs
    def fn(x, b):
        return torch.ops.demo.demo_scale(x, b, 2.0) + 1

    for device in ("meta", "cpu"):
        torch._dynamo.reset()
        since = len(LOADED)
        x, b = torch.randn(2, 3, device=device), torch.randn(2, 3, device=device)
        out = torch.compile(fn, backend=backend, fullgraph=True)(x, b)
        dump_loaded(f"1. keyword custom_op, {device} inputs", since)
        print("result:", out.shape, out.device, "" if device == "meta" else torch.allclose(out, fn(x, b)))

    # 2. positional form
    torch._dynamo.reset()
    style["form"] = "positional"
    since = len(LOADED)
    x = torch.randn(2, 3)
    out = torch.compile(lambda x: torch.ops.demo.demo_scale(x, None, 3.0), backend=backend, fullgraph=True)(x)
    dump_loaded("2. positional custom_op (prototype via get_registered_ir_def)", since)
    print("result ok:", torch.allclose(out, x * 3.0))
    style["form"] = "keyword"

    # 3. automatic converter (no converter registered for demo::auto_scale)
    torch._dynamo.reset()
    since = len(LOADED)
    x, o1, o2 = torch.randn(4), torch.randn(4), torch.randn(4)
    out = torch.compile(
        lambda x, a, b: torch.ops.demo.auto_scale(x, [a, b], 0.5, 3), backend=backend, fullgraph=True
    )(x, o1, o2)
    dump_loaded("3. automatic converter", since)
    print("result ok:", torch.allclose(out, x * 0.5 + o1 + o2))

    # 4. training step, dynamic shapes: forward and backward graphs
    torch._dynamo.reset()
    since = len(LOADED)

    def loss_fn(x, b):
        return torch.ops.demo.demo_scale(x, b, 2.0).sum()

    step = torch.compile(loss_fn, backend=backend, fullgraph=True, dynamic=True)
    for n in (5, 7):
        x = torch.randn(n, 3, requires_grad=True)
        b = torch.randn(n, 3, requires_grad=True)
        step(x, b).backward()
        grads_ok = torch.allclose(x.grad, torch.full_like(x, 2.0)) and torch.allclose(b.grad, torch.ones_like(b))
        print(f"n={n}: grads ok:", grads_ok)
    dump_loaded("4. training step, dynamic=True", since)

    print("\nget_registered_ir_def queries:", IR_QUERIES)
    print("graphs loaded:", [(r["name"], r["runs"]) for r in LOADED])


if __name__ == "__main__":
    main()
