"""One FX node of our ops -> a GE GraphDef, through its converter (as torchair's fx2ge does).

    Data(0..k-1) for the node's distinct tensor arguments -> converter -> NetOutput

Each Data takes its dtype and shape from the FakeTensor torch traced for that argument;
symbolic dims (torch.compile's dynamic shapes) become -1. The converter receives the node's
arguments with tensors replaced by graph tensors and numbers computed in the graph (an
attribute taken from a shape) by their traced values, specialised under a guard, plus
`meta_outputs` (the traced outputs), and the traced outputs are recorded on the node's output
descs for the local GE to check.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import fx
from torch.fx.experimental.symbolic_shapes import guard_scalar

from attnres_ge.ge_plugin import ge
from attnres_ge.ge_plugin.ge_ir import GraphDef

# Numbers an FX node may compute for an attribute, e.g. valid_block_num=block_res.shape[1]. A GE
# attribute is a constant of the compiled graph, so a symbolic one is specialised to the value it
# traced with, under a guard: torch.compile recompiles when a later call brings another value.
SCALARS = (bool, int, float, torch.SymBool, torch.SymInt, torch.SymFloat)


def _traced_value(node: fx.Node):
    if "val" not in node.meta:
        raise ge.GraphBuildError(f"FX node {node.name!r} carries no traced value (node.meta['val'])")
    return node.meta["val"]


def build_node_graph(node: fx.Node, converter: Callable) -> tuple[GraphDef, list[fx.Node]]:
    """The GraphDef for `node` and the FX nodes feeding its Data inputs, in Data index order."""
    data_for: dict[fx.Node, ge.GraphTensor] = {}

    def to_graph(arg):
        if not isinstance(arg, fx.Node):
            return arg
        if arg not in data_for:
            value = _traced_value(arg)
            if isinstance(value, SCALARS):
                return guard_scalar(value)
            if not isinstance(value, torch.Tensor):
                raise ge.GraphBuildError(f"FX node {node.name!r}: argument {arg.name!r} is neither a tensor nor "
                                         f"a number ({value!r})")
            data_for[arg] = ge.Data(len(data_for), value.dtype, value.shape, node_name=arg.name)
        return data_for[arg]

    meta_outputs = _traced_value(node)
    with ge.Graph(name=node.name) as graph:
        args = fx.node.map_aggregate(node.args, to_graph)
        kwargs = fx.node.map_aggregate(node.kwargs, to_graph)
        outputs = converter(*args, **kwargs, meta_outputs=meta_outputs)
        outputs = list(outputs) if isinstance(outputs, (tuple, list)) else [outputs]
        traced = list(meta_outputs) if isinstance(meta_outputs, (tuple, list)) else [meta_outputs]
        for tensor, meta in zip(outputs, traced, strict=True):
            ge.set_traced_meta(tensor, meta.dtype, meta.shape)
        ge.NetOutput(outputs)
    return graph.graph_def, list(data_for)
