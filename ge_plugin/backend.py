"""`torch.compile` backend that runs our ops through the local GE: `backend=attnres_ge.ge_backend()`.

    torch.compile(model, backend=attnres_ge.ge_backend(dump_path="ge_graphs"))
    torch.compile(model, backend="attnres_ge")        # the same, registered with dynamo

Dynamo's graph goes through AOTAutograd, so the forward and the backward FX graphs both come
here. A graph in which no value can carry a gradient (grad mode off, or no input nor traced
value requiring one) skips AOTAutograd and is lowered as dynamo traced it, which spares each
call AOTAutograd's runtime wrappers; dynamo guards on grad mode and on every input's
requires_grad, so such a graph never runs where a gradient is wanted. In every graph, each
node of the attnres ops (or CANN's same-schema ops) is converted by its converter into a GE
GraphDef, compiled by the local GE (prototype check, InferShape against torch's traced
tensors, TilingParse) and replaced by a call of the compiled graph; every other node stays
the torch code it was and runs as is, so results are bit-identical to eager.
Dynamic token counts compile once: unknown dims stay -1 and Tiling runs per actual shape.

An op updating an argument in place (`Tensor(a!)`, a GE reference output) reaches a backend in two
forms: dynamo's graph holds the op itself, and its GE graph writes the new value into the tensor
fed to it, the caller's; AOTAutograd's functionalized graph holds auto_functionalized(op, ...),
which is rewritten first (fx_to_ge.inline_mutations) into the op updating a clone, the clone
being the new value that AOTAutograd copies into the caller's tensor. Either way the caller's
tensor ends up with the bits the eager op leaves.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
import torch.utils._pytree as pytree
from torch import fx

from attnres_ge.ge_plugin.converters import local_converters
from attnres_ge.ge_plugin.fx_to_ge import build_node_graph, inline_mutations
from attnres_ge.ge_plugin.ge_ir import GraphDef
from attnres_ge.ge_plugin.local_ge import CompiledGraph, compile_graph
from attnres_ge.op_kernel.launcher import HostRuntime

DYNAMO_BACKEND_NAME = "attnres_ge"


def ge_graph_call(compiled: CompiledGraph, structure: pytree.TreeSpec, name: str):
    """A function running one compiled GE graph in place of an FX node, named `name` in the GraphModule's
    code; it returns the NetOutput tensors as the op did (`structure`, the traced result's): the tensor
    itself for an op that returns one, a tuple, or a tuple holding a list (a dynamic output). A function,
    not a submodule: nn.Module's call costs 60 us a call once a large kernel has swept the caches
    (docs/notes/performance-runs.md); so is the pytree rebuild, kept to the ops that need it."""
    if structure.is_leaf():
        def call(*tensors: torch.Tensor) -> torch.Tensor:
            return compiled(*tensors)[0]
    elif all(child.is_leaf() for child in structure.children()):
        def call(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
            return tuple(compiled(*tensors))
    else:
        def call(*tensors: torch.Tensor) -> tuple:
            return pytree.tree_unflatten(compiled(*tensors), structure)
    call.__name__ = call.__qualname__ = name
    return call


class GeBackend:
    """A torch.compile backend; `graphs` lists every GraphDef it compiled (output descs filled), in order."""

    def __init__(self, *, dump_path: str | Path | None = None, runtime: HostRuntime | None = None):
        from torch._dynamo.backends.common import aot_autograd

        self.dump_path = dump_path
        self.runtime = runtime
        self.graphs: list[GraphDef] = []
        self.fx_graphs: list[fx.GraphModule] = []  # the FX graphs after lowering (forward, backward, ...)
        self._aot = aot_autograd(fw_compiler=self.compile_fx_graph, bw_compiler=self.compile_fx_graph)

    def __call__(self, gm: fx.GraphModule, example_inputs: Sequence, **kwargs):
        if _may_need_gradients(gm, example_inputs):
            return self._aot(gm, example_inputs)
        for node in gm.graph.nodes:  # dynamo's graph: ops by packet, traced values as example_value
            if isinstance(node.target, torch._ops.OpOverloadPacket):
                node.target = node.target.default
            if "val" not in node.meta and "example_value" in node.meta:
                node.meta["val"] = node.meta["example_value"]
        return self.lower_fx_graph(gm).forward

    def compile_fx_graph(self, gm: fx.GraphModule, example_inputs: Sequence):
        """AOTAutograd's compiler: lower one of its graphs (forward or backward), boxed as it calls them."""
        from torch._functorch.aot_autograd import make_boxed_func

        return make_boxed_func(self.lower_fx_graph(gm).forward)

    def lower_fx_graph(self, gm: fx.GraphModule) -> fx.GraphModule:
        """Lower our op nodes to compiled GE graphs; the rest runs as torch code."""
        converters = local_converters()
        inline_mutations(gm, converters)  # functionalized calls of our in-place ops: the ops themselves again
        for node in list(gm.graph.nodes):
            if node.op == "call_function" and node.target in converters:
                self._lower(gm, node, converters[node.target])
        gm.graph.lint()
        gm.recompile()
        self.fx_graphs.append(gm)
        return gm

    def _lower(self, gm: fx.GraphModule, node: fx.Node, converter) -> None:
        graph_def, tensor_args = build_node_graph(node, converter)
        compiled = compile_graph(graph_def, self.runtime, self.dump_path)
        self.graphs.append(graph_def)
        structure = pytree.tree_structure(node.meta["val"])
        run = ge_graph_call(compiled, structure, f"ge_{node.name}")
        with gm.graph.inserting_before(node):
            call = gm.graph.call_function(run, tuple(tensor_args))
        call.meta = dict(node.meta)
        node.replace_all_uses_with(call)
        gm.graph.erase_node(node)


def _may_need_gradients(gm: fx.GraphModule, example_inputs: Sequence) -> bool:
    """Whether grad mode is on and any input or traced value of the graph requires a gradient."""
    if not torch.is_grad_enabled():
        return False
    traced = [node.meta.get("example_value") for node in gm.graph.nodes]
    values = torch.utils._pytree.tree_leaves([list(example_inputs), traced])
    return any(isinstance(value, torch.Tensor) and value.requires_grad for value in values)


def ge_backend(*, dump_path: str | Path | None = None, runtime: HostRuntime | None = None) -> GeBackend:
    """A torch.compile backend running our ops on the local GE.

    Args:
        dump_path: folder to write every compiled GE graph to as `.pbtxt` (like torchair's graph dump).
        runtime: the host runtime to tile and launch with (default: the process runtime eager uses).
    """
    return GeBackend(dump_path=dump_path, runtime=runtime)


def _dynamo_entry(gm: fx.GraphModule, example_inputs: Sequence, options: dict | None = None):
    """What `backend="attnres_ge"` calls; torch.compile's `options` become ge_backend's keywords."""
    return ge_backend(**(options or {}))(gm, example_inputs)


def register_dynamo_backend() -> None:
    """Make `torch.compile(..., backend="attnres_ge")` work (idempotent)."""
    from torch._dynamo import register_backend

    try:
        register_backend(_dynamo_entry, name=DYNAMO_BACKEND_NAME)
    except AssertionError:  # dynamo's answer to a duplicate name: registered already
        pass
