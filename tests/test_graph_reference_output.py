"""Graph mode for an op that updates an argument in place (`Tensor(a!)`, a GE reference output), on the
stand-in op tests/third_op/add_into.py (x += y in place, returns z = alpha * x), in a fresh process with
the Python kernels since the stand-in's registry entry and torch op last for the life of the process.

torch.compile hands a backend such an op in two forms, both checked here against eager, bit for bit in
the op's result and in the caller's tensor after the call: dynamo's graph (nothing needs a gradient)
holds the op itself, which the GE graph runs writing into the caller's tensor; AOTAutograd's graph holds
auto_functionalized_v2(op, ...), which the backend turns back into the op updating a clone (views of a
graph input regenerated on it) that AOTAutograd copies into the caller's tensor."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

HERE = Path(__file__).resolve().parent

SCRIPT = textwrap.dedent(
    """
    import sys

    import torch
    import torch._dynamo
    from torch._dynamo.utils import counters

    import attnres_ge
    from attnres_ge.ge_plugin import ge
    from attnres_ge.ge_plugin.local_ge import compile_graph
    from attnres_ge.op_proto import AttnResInputError
    sys.path.insert(0, sys.argv[1])
    import add_into

    op = torch.ops.attnres.add_into
    generator = torch.Generator().manual_seed(0)
    x0, y = torch.randn(6, 40, generator=generator), torch.randn(6, 40, generator=generator)
    w = torch.randn(6, 40, generator=generator, requires_grad=True)  # makes the graph go through AOTAutograd


    def flat(value):
        return list(value) if isinstance(value, (tuple, list)) else [value]


    def eager_vs_graph(case, fn, make_args, backend=None):
        backend = backend or attnres_ge.ge_backend()
        runs = []
        for call in (fn, torch.compile(fn, backend=backend)):
            args = make_args()
            runs.append((flat(call(*args)), args))
        torch._dynamo.reset()
        (eager_out, eager_args), (graph_out, graph_args) = runs
        assert all(torch.equal(a, b) for a, b in zip(eager_out, graph_out, strict=True)), f"{case}: results differ"
        for index, (a, b) in enumerate(zip(eager_args, graph_args, strict=True)):
            assert torch.equal(a, b), f"{case}: argument {index} differs after the call"
            base_a, base_b = (a if a._base is None else a._base), (b if b._base is None else b._base)
            assert torch.equal(base_a, base_b), f"{case}: the storage under argument {index} differs after the call"
        assert not torch.equal(graph_args[0], make_args()[0]), f"{case}: the caller's tensor was not updated"
        return backend


    def targets(gm):
        return [node.target for node in gm.graph.nodes if node.op == "call_function"]


    # dynamo's graph: the op itself, its GE graph writing into the caller's x
    backend = eager_vs_graph("inference", lambda x, y: op(x, y, 0.5) * 3, lambda: (x0.clone(), y))
    [graph] = backend.graphs
    assert [node.type for node in graph.op] == ["Data", "Data", "AddInto", "NetOutput"]
    node = graph.op[2]
    assert [d.name for d in node.input_desc] == ["x", "y"] and [d.name for d in node.output_desc] == ["x", "z"]
    assert list(node.output_desc[0].shape.dim) == [6, 40] and list(graph.op[-1].input) == ["AddInto:1"]
    assert torch.ops.aten.clone.default not in targets(backend.fx_graphs[0])

    # AOTAutograd's graph: auto_functionalized_v2 back to the op on a clone, none left
    backend = eager_vs_graph("training", lambda x, y: (op(x, y, 2.0) * w).sum(), lambda: (x0.clone(), y))
    [forward, *_] = backend.fx_graphs
    assert torch.ops.aten.clone.default in targets(forward), forward.graph
    assert not [t for t in targets(forward) if "auto_functionalized" in str(t)], forward.graph

    # the first auto_functionalized (no view records): the same rewrite
    import torch._inductor.config as inductor_config
    inductor_config.enable_auto_functionalized_v2 = False
    backend = eager_vs_graph("training-v1", lambda x, y: (op(x[1:], y[1:], 2.0) * w[1:]).sum(), lambda: (x0.clone(), y))
    assert not [t for t in targets(backend.fx_graphs[0]) if "auto_functionalized" in str(t)], backend.fx_graphs[0].graph
    inductor_config.enable_auto_functionalized_v2 = True

    def strided():  # a caller's tensor that is not contiguous: updated through a contiguous copy
        return (x0.repeat(1, 2)[:, ::2],)

    eager_vs_graph("strided-inference", lambda x: op(x, y), strided)
    eager_vs_graph("strided-training", lambda x: (op(x, y) * w).sum(), strided)
    # views taken in the graph: regenerated on the clone of their base (slice, as_strided records)
    eager_vs_graph("slice-inference", lambda x: op(x[1:], y[1:]), lambda: (x0.clone(),))
    eager_vs_graph("slice-training", lambda x: (op(x[1:], y[1:]) * w[1:]).sum(), lambda: (x0.clone(),))
    eager_vs_graph("transpose-training", lambda x: (op(x.t(), y) * w).sum(), lambda: (x0.t().contiguous(),))
    eager_vs_graph("strided-view-training", lambda x: (op(x[:, ::2], y[:, :20]) * w[:, :20]).sum(),
                   lambda: (x0.clone(),))

    # dynamic T: one compile
    for requires_grad in (False, True):
        backend = attnres_ge.ge_backend()
        scale = torch.tensor(2.0, requires_grad=requires_grad)
        fn = lambda x, y: (op(x, y) * scale).sum(dim=1)  # noqa: E731
        compiled = torch.compile(fn, backend=backend)
        counters.clear()
        for tokens in (5, 9, 17, 3):
            xs = [torch.randn(tokens, 40, generator=torch.Generator().manual_seed(tokens)) for _ in range(2)]
            ys = torch.randn(tokens, 40)
            for tensor in (xs[1], ys):
                torch._dynamo.mark_dynamic(tensor, 0)
            want, got = fn(xs[0], ys), compiled(xs[1], ys)
            assert torch.equal(want, got) and torch.equal(xs[0], xs[1]), f"T={tokens}: graph differs from eager"
        assert counters["stats"]["unique_graphs"] == 1, dict(counters)
        [node] = [node for graph in backend.graphs for node in graph.op if node.type == "AddInto"]
        assert [list(desc.shape.dim) for desc in node.output_desc] == [[-1, 40], [-1, 40]], node
        torch._dynamo.reset()

    # a GraphDef feeding the updated input and another from one tensor fails to compile, naming both
    with ge.Graph("aliased") as built:
        x = ge.Data(0, torch.float32, [6, 40])
        _, z = ge.custom_op("AddInto", inputs={"x": x, "y": x}, outputs=["x", "z"])
        ge.NetOutput([z])
    try:
        compile_graph(built.graph_def)
    except AttnResInputError as error:
        message = str(error)
        assert "AddInto updates 'x' in place" in message and "'y'" in message and "Data:0" in message, message
    else:
        raise AssertionError("a graph updating an input that another input reads compiled")
    print("reference outputs ok")
    """
)


def test_in_place_op_in_graph_mode_matches_eager_in_result_and_callers_tensor():
    env = dict(os.environ, ATTNRES_GE_KERNEL="python")
    result = subprocess.run([sys.executable, "-c", SCRIPT, str(HERE / "third_op")], env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr[-6000:]
    assert "reference outputs ok" in result.stdout
