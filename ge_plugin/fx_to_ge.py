"""One FX node of our ops -> a GE GraphDef, through its converter (as torchair's fx2ge does).

    Data(0..k-1) for the node's distinct tensor arguments -> converter -> NetOutput

A list argument (a dynamic input) gives a Data per distinct tensor of it; a list result (a
dynamic output) one NetOutput input per tensor, in the order of the traced outputs flattened.
Each Data takes its dtype and shape from the FakeTensor torch traced for that argument;
symbolic dims (torch.compile's dynamic shapes) become -1. The converter receives the node's
arguments with tensors replaced by graph tensors and numbers computed in the graph (an
attribute taken from a shape) by their traced values, specialised under a guard, plus
`meta_outputs` (the traced outputs), and the traced outputs are recorded on the node's output
descs for the local GE to check.
"""

from __future__ import annotations

import contextlib
import operator
from collections.abc import Callable

import torch
import torch.utils._pytree as pytree
from torch import fx
from torch._guards import detect_fake_mode
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
        # Flattened alike: an op returning a list (a dynamic output) gives one NetOutput input per tensor.
        outputs = pytree.tree_leaves(converter(*args, **kwargs, meta_outputs=meta_outputs))
        traced = pytree.tree_leaves(meta_outputs)
        for tensor, meta in zip(outputs, traced, strict=True):
            ge.set_traced_meta(tensor, meta.dtype, meta.shape)
        ge.NetOutput(outputs)
    return graph.graph_def, list(data_for)


# How torch.compile's functionalization (AOTAutograd) presents an op with a `Tensor(a!)` argument: a
# functional call of it, auto_functionalized(_v2)(op, **kwargs) -> (op's outputs..., new values of
# what it mutates), the caller's tensor then being updated from those values (AOTAutograd's copy_
# epilogue). Dynamo's own graph (no AOTAutograd) keeps the op itself, mutating its argument.
AUTO_FUNCTIONALIZED = (torch.ops.higher_order.auto_functionalized, torch.ops.higher_order.auto_functionalized_v2)


def inline_mutations(gm: fx.GraphModule, ops) -> int:
    """Rewrite every auto_functionalized call of an op in `ops` as the functional call is defined: clones of
    the tensors the op mutates (views regenerated on the clones), the op itself mutating them, the clones
    as the new values. The op node is then converted like any other, its GE graph writing the reference
    output into the clone; the caller's tensor is updated by AOTAutograd's epilogue as before, with the
    bits the op wrote. Returns the number of calls rewritten."""
    rewritten = 0
    for node in list(gm.graph.nodes):
        if node.op == "call_function" and node.target in AUTO_FUNCTIONALIZED and node.args[0] in ops:
            _inline_mutation(gm.graph, node)
            rewritten += 1
    return rewritten


def _mutable_names(schema) -> list[str]:
    return [arg.name for arg in schema.arguments if arg.alias_info is not None and arg.alias_info.is_write]


def _add_node(graph: fx.Graph, target, args: tuple, val) -> fx.Node:
    node = graph.call_function(target, args)
    node.meta["val"] = val
    return node


def _traced(args: tuple) -> tuple:
    return fx.node.map_aggregate(args, lambda arg: _traced_value(arg) if isinstance(arg, fx.Node) else arg)


def _regenerate_view(graph: fx.Graph, kwargs: dict, name: str, bases: list[fx.Node]) -> fx.Node | None:
    """auto_functionalized_v2's view record of mutable argument `name` (`_<name>_base_index`, then an
    alias, an as_strided or a slice record, or none: the base itself), applied to the new bases."""
    prefix = f"_{name}"
    base_index = kwargs[f"{prefix}_base_index"]
    if base_index is None:
        return None
    base = bases[base_index]
    if f"{prefix}_alias" in kwargs:
        target, args = torch.ops.aten.alias.default, (base,)
    elif f"{prefix}_storage_offset" in kwargs:
        target = torch.ops.aten.as_strided.default
        args = (base, kwargs[f"{prefix}_size"], kwargs[f"{prefix}_stride"], kwargs[f"{prefix}_storage_offset"])
    elif f"{prefix}_slice_dim" in kwargs:
        target = torch.ops.aten.slice.Tensor
        args = (base, kwargs[f"{prefix}_slice_dim"], kwargs[f"{prefix}_slice_start"], kwargs[f"{prefix}_slice_end"])
    else:
        return base
    traced = _traced(args)
    with detect_fake_mode(traced) or contextlib.nullcontext():
        val = target(*traced)
    return _add_node(graph, target, args, val)


def _inline_mutation(graph: fx.Graph, node: fx.Node) -> None:
    op, kwargs = node.args[0], dict(node.kwargs)
    schema = op._schema
    mutable = _mutable_names(schema)
    results = _traced_value(node)  # (outputs..., new values)
    first_new = max(len(schema.returns), 1)
    with graph.inserting_before(node):
        if node.target is torch.ops.higher_order.auto_functionalized_v2:
            bases = kwargs["_all_bases"]
            cloned = kwargs.get("_only_clone_these_bases")
            cloned = range(len(bases)) if cloned is None else cloned
            new_values = [_add_node(graph, torch.ops.aten.clone.default, (base,), results[first_new + index])
                          if index in cloned else base for index, base in enumerate(bases)]
            arguments = {name: _regenerate_view(graph, kwargs, name, new_values) for name in mutable}
        else:
            cloned = kwargs.get("_only_clone_these_tensors")
            new_values = [_add_node(graph, torch.ops.aten.clone.default, (kwargs[name],), results[first_new + index])
                          if cloned is None or name in cloned else kwargs[name]
                          for index, name in enumerate(mutable)]
            arguments = dict(zip(mutable, new_values, strict=True))
        for arg in schema.arguments:
            if arg.name not in arguments and arg.name in kwargs:
                arguments[arg.name] = kwargs[arg.name]
        positional = []
        for arg in schema.arguments:  # positionally up to the first one left out (it takes its default)
            if arg.kwarg_only or arg.name not in arguments:
                break
            positional.append(arguments.pop(arg.name))
        call = graph.call_function(op, tuple(positional), arguments)
        call.meta["val"] = results[0] if len(schema.returns) <= 1 else tuple(results[:len(schema.returns)])
        outputs = ([call] if len(schema.returns) <= 1 else
                   [_add_node(graph, operator.getitem, (call, index), results[index])
                    for index in range(len(schema.returns))])
    for user in list(node.users):
        if user.op != "call_function" or user.target is not operator.getitem:
            raise ge.GraphBuildError(f"FX node {node.name!r} ({op}): its result is used by {user.name!r} "
                                     f"({user.target}), not by indexing")
        index = user.args[1]
        user.replace_all_uses_with(outputs[index] if index < first_new else new_values[index - first_new])
        graph.erase_node(user)
    graph.erase_node(node)
