"""The local GE: compile (prototype check, InferShape, TilingParse), run (Tiling, buffers, kernel), dump."""

from __future__ import annotations

import gc
import math
import warnings
import weakref

import pytest
import torch
from conftest import host
from google.protobuf import text_format

import attnres_ge  # noqa: F401
import attnres_ge.op_kernel as op_kernel
from attnres_ge.ge_plugin import ge, ge_ir
from attnres_ge.ge_plugin.converters import make_converter
from attnres_ge.ge_plugin.local_ge import GraphCompileError, GraphRunError, compile_graph
from attnres_ge.ge_plugin.op_common import CPP_ENTRY
from attnres_ge.ge_plugin.ops import BLOCK_ATTENTION_RESIDUALS, BLOCK_ATTENTION_RESIDUALS_GRAD
from attnres_ge.op_host import block_attention_residuals_tiling as forward_tiling
from attnres_ge.op_host.platform import PlatformInfo
from attnres_ge.op_kernel.launcher import HostRuntime
from attnres_ge.op_proto import AttnResInputError

convert_block_attention_residuals = make_converter(BLOCK_ATTENTION_RESIDUALS, ge)
convert_block_attention_residuals_backward = make_converter(BLOCK_ATTENTION_RESIDUALS_GRAD, ge)

F32 = torch.float32
SOME_HOST = host(4, 1024 * 1024)  # the graphs' results are the same on every host
T, N, H = 6, 3, 16


def forward_specs(tokens=T, blocks=N, hidden=H, dtype=F32):
    """(dtype, shape) of the forward's four inputs."""
    return [(dtype, [tokens, hidden]), (dtype, [tokens, blocks, hidden]), (dtype, [1, hidden]), (dtype, [hidden])]


def backward_specs(tokens=T, blocks=N, hidden=H, dtype=F32):
    rows = blocks + 1 if blocks >= 0 else -1
    return [*forward_specs(tokens, blocks, hidden, dtype), (dtype, [tokens, hidden]), (F32, [tokens, rows]),
            (F32, [tokens, rows])]


def build(converter, specs, *args, **kwargs) -> ge_ir.GraphDef:
    """A graph: Data per spec -> converter(...) -> NetOutput."""
    with ge.Graph("test") as graph:
        data = [ge.Data(i, dtype, shape, node_name=f"input{i}") for i, (dtype, shape) in enumerate(specs)]
        outputs = converter(*data, *args, **kwargs)
        ge.NetOutput(list(outputs))
    return graph.graph_def


def forward_inputs(tokens=T, blocks=N, hidden=H, dtype=F32, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=generator).to(dtype) for _, shape in forward_specs(tokens, blocks, hidden)]


def test_forward_graph_equals_eager_and_fills_output_descs():
    graph_def = build(convert_block_attention_residuals, forward_specs(), -1, 1e-6, True)
    compiled = compile_graph(graph_def)
    node = graph_def.op[4]
    assert [(d.dtype, list(d.shape.dim)) for d in node.output_desc] == [
        (ge_ir.DT_FLOAT, [T, H]), (ge_ir.DT_FLOAT, [T, N + 1]), (ge_ir.DT_FLOAT, [T, N + 1])]
    inputs = forward_inputs()
    expected = torch.ops.attnres.block_attention_residuals(*inputs, -1, 1e-6, True)
    for name, got, want in zip(("hidden_states", "inv_norm", "probs"), compiled(*inputs), expected, strict=True):
        assert torch.equal(got, want), name


def test_dynamic_tokens_compile_with_unknown_dims_and_run_at_many_t():
    graph_def = build(convert_block_attention_residuals, forward_specs(tokens=-1), -1, 1e-6, True)
    compiled = compile_graph(graph_def)
    assert [list(d.shape.dim) for d in graph_def.op[4].output_desc] == [[-1, H], [-1, N + 1], [-1, N + 1]]
    for tokens in (1, 5, 70, 0):
        inputs = forward_inputs(tokens=tokens)
        expected = torch.ops.attnres.block_attention_residuals(*inputs, -1, 1e-6, True)
        assert all(torch.equal(a, b) for a, b in zip(compiled(*inputs), expected, strict=True)), tokens
    bad = forward_inputs(tokens=4)
    bad[1] = bad[1][:3]
    with pytest.raises(AttnResInputError, match=r"node 'BlockAttentionResiduals'.*block_res must have shape"):
        compiled(*bad)


def test_absent_attributes_take_prototype_defaults():
    graph_def = build(convert_block_attention_residuals, forward_specs())
    node = graph_def.op[4]
    for name in ("valid_block_num", "norm_eps", "need_backward"):
        del node.attr[name]
    compiled = compile_graph(graph_def)
    assert list(node.output_desc[1].shape.dim) == [0]  # need_backward defaults to false
    inputs = forward_inputs()
    expected = torch.ops.attnres.block_attention_residuals(*inputs)
    assert all(torch.equal(a, b) for a, b in zip(compiled(*inputs), expected, strict=True))


def test_attribute_in_the_wrong_field_is_rejected():
    graph_def = build(convert_block_attention_residuals, forward_specs())
    graph_def.op[4].attr["norm_eps"].i = 1
    with pytest.raises(AttnResInputError, match=r"node 'BlockAttentionResiduals'.*'norm_eps' must be Float, got Int"):
        compile_graph(graph_def)


def test_unknown_op_type_in_a_graphdef_is_rejected():
    graph_def = build(convert_block_attention_residuals, forward_specs())
    graph_def.op[4].type = "Mystery"
    with pytest.raises(AttnResInputError, match=r"node 'BlockAttentionResiduals'.*Mystery"):
        compile_graph(graph_def)


def test_traced_outputs_disagreeing_with_infershape_is_a_bug_report_naming_the_node():
    with ge.Graph("test") as graph:
        data = [ge.Data(i, dtype, shape) for i, (dtype, shape) in enumerate(forward_specs())]
        outputs = convert_block_attention_residuals(*data, -1, 1e-6, True)
        ge.set_traced_meta(outputs[1], F32, [T, N])  # wrong: N+1 rows
        ge.NetOutput(list(outputs))
    with pytest.raises(GraphCompileError, match=r"node 'BlockAttentionResiduals'.*output 'inv_norm'.*torch traced"):
        compile_graph(graph.graph_def)


def test_graph_inputs_must_match_the_data_descs():
    compiled = compile_graph(build(convert_block_attention_residuals, forward_specs(tokens=-1)))
    inputs = forward_inputs()
    with pytest.raises(GraphRunError, match=r"input 3 \(node 'input3'\)"):
        compiled(*inputs[:3], inputs[3].double())
    with pytest.raises(GraphRunError, match="takes 4 inputs, got 3"):
        compiled(*inputs[:3])


def _set(specs, index, dtype=None, shape=None):
    old_dtype, old_shape = specs[index]
    specs[index] = (dtype or old_dtype, old_shape if shape is None else shape)
    return specs


FORWARD_RULES = [
    pytest.param(_set(forward_specs(), 0, dtype=torch.float64), {}, "partial_block must have dtype in", id="dtype"),
    pytest.param(_set(forward_specs(), 1, dtype=torch.float16), {}, "block_res must have the dtype of partial_block",
                 id="mixed-dtype"),
    pytest.param(_set(forward_specs(), 3, dtype=torch.bfloat16), {}, "norm_weight must have the dtype",
                 id="mixed-dtype-norm"),
    pytest.param(_set(forward_specs(), 0, shape=[T, 1, H]), {}, "partial_block must be 2-D", id="rank"),
    pytest.param(_set(forward_specs(), 1, shape=[T + 1, N, H]), {}, r"block_res must have shape \[T, N, H\]",
                 id="tokens-mismatch"),
    pytest.param(_set(forward_specs(), 1, shape=[T, N, H + 1]), {}, "block_res must have shape", id="hidden-mismatch"),
    pytest.param(_set(forward_specs(), 2, shape=[2, H]), {}, "proj_weight must have shape", id="proj-shape"),
    pytest.param(_set(forward_specs(), 3, shape=[H, 1]), {}, "norm_weight must be 1-D", id="norm-rank"),
    pytest.param(forward_specs(blocks=0), {}, r"1 <= N.*<= 100.*got N.* = 0$",
                 id="N0"),
    pytest.param(forward_specs(blocks=101), {}, r"1 <= N.*<= 100.*got N.* = 101$",
                 id="N101"),
    pytest.param(forward_specs(hidden=0), {}, r"(1 <= H|H >= 1).*got H.* = 0$", id="H0"),
    pytest.param(forward_specs(), {"norm_eps": 0.0}, "norm_eps must be finite and > 0", id="eps0"),
    pytest.param(forward_specs(), {"norm_eps": -1e-6}, "norm_eps must be finite and > 0", id="eps-negative"),
    pytest.param(forward_specs(), {"norm_eps": math.inf}, "norm_eps must be finite and > 0", id="eps-inf"),
    pytest.param(forward_specs(), {"norm_eps": math.nan}, "norm_eps must be finite and > 0", id="eps-nan"),
    pytest.param(forward_specs(), {"norm_eps": 1e-50}, r"norm_eps must be finite and > 0 as a float32", id="eps-1e-50"),
    pytest.param(forward_specs(), {"norm_eps": 3.5e38}, r"norm_eps must be finite and > 0 as a float32",
                 id="eps-3.5e38"),
    pytest.param(forward_specs(), {"valid_block_num": 2}, "valid_block_num is reserved and must be -1 or N = 3",
                 id="valid-block-num"),
]


@pytest.mark.parametrize(("specs", "attrs", "message"), FORWARD_RULES)
def test_forward_bad_inputs_fail_at_compile_naming_the_node(specs, attrs, message):
    graph_def = build(convert_block_attention_residuals, specs, **attrs)
    with pytest.raises(AttnResInputError, match=r"node 'BlockAttentionResiduals' .*\(graph build, InferShape\)"):
        compile_graph(graph_def)
    with pytest.raises(AttnResInputError, match=message):
        compile_graph(build(convert_block_attention_residuals, specs, **attrs))


BACKWARD_RULES = [
    pytest.param(_set(backward_specs(), 5, dtype=torch.float16), "inv_norm must have dtype in", id="inv-norm-dtype"),
    pytest.param(_set(backward_specs(), 6, dtype=torch.bfloat16), "probs must have dtype in", id="probs-dtype"),
    pytest.param(_set(backward_specs(), 4, dtype=torch.float16), "grad_hidden_states must have the dtype",
                 id="grad-dtype"),
    pytest.param(_set(backward_specs(), 4, shape=[T, H + 1]), "grad_hidden_states must have shape", id="grad-shape"),
    pytest.param(_set(backward_specs(), 6, shape=[T, N]), r"probs must have shape \[T, N\+1\]", id="probs-rows"),
    pytest.param(_set(backward_specs(), 2, shape=[H]), r"proj_weight must be 2-D \[1, H\]", id="proj-rank"),
    pytest.param(backward_specs(blocks=129), r"0 <= N.*<= 128.*got N.* = 129$", id="N129"),
]


@pytest.mark.parametrize(("specs", "message"), BACKWARD_RULES)
def test_backward_bad_inputs_fail_at_compile_naming_the_node(specs, message):
    with pytest.raises(AttnResInputError, match=r"node 'BlockAttentionResidualsGrad' .*" + message):
        compile_graph(build(convert_block_attention_residuals_backward, specs))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("blocks", [0, 2], ids=lambda n: f"N{n}")
def test_backward_graph_equals_eager(dtype, blocks):
    compiled = compile_graph(build(convert_block_attention_residuals_backward, backward_specs(-1, blocks, H, dtype)))
    generator = torch.Generator().manual_seed(1)
    tensors = [torch.randn(shape, generator=generator).to(spec_dtype)
               for spec_dtype, shape in backward_specs(T, blocks, H, dtype)]
    expected = torch.ops.attnres.block_attention_residuals_backward(*tensors)
    for got, want in zip(compiled(*tensors), expected, strict=True):
        assert torch.equal(got, want)


class CountingRuntime(HostRuntime):
    """Counts the TilingParse (compile_info) requests it gets."""

    def __init__(self, platform):
        super().__init__(platform)
        self.parses = 0
        self.tilings = 0

    def compile_info(self, op):
        self.parses += 1
        return super().compile_info(op)

    def tiling(self, op, inputs, attrs):
        self.tilings += 1
        return super().tiling(op, inputs, attrs)


def _two_node_graph():
    with ge.Graph("two") as graph:
        data = [ge.Data(i, dtype, shape) for i, (dtype, shape) in enumerate(forward_specs(tokens=-1))]
        first = convert_block_attention_residuals(*data, -1, 1e-6, False)
        second = convert_block_attention_residuals(first[0], *data[1:], -1, 1e-6, False)
        ge.NetOutput([second[0]])
    return graph.graph_def


def test_tiling_parse_once_per_node_and_tiling_once_per_shape(monkeypatch):
    parse_runs = []
    parse = forward_tiling.tiling_parse  # what the forward's TilingParse runs
    monkeypatch.setattr(forward_tiling, "tiling_parse",
                        lambda op_type, platform: parse_runs.append(platform) or parse(op_type, platform))
    runtime = CountingRuntime(PlatformInfo(SOME_HOST))
    compiled = compile_graph(_two_node_graph(), runtime)
    assert runtime.parses == 2  # each node took its TilingParse result at compile
    for tokens in (3, 3, 3, 9, 9):
        compiled(*forward_inputs(tokens=tokens))
    assert len(parse_runs) == 1  # TilingParse ran once for the op type; runs never re-parse
    # planned (InferShape + Tiling) once per distinct input signature, which both nodes share
    assert runtime.tilings == 2
    assert all(op.compile_info.op_type == "BlockAttentionResiduals" for op in compiled.ops)


@pytest.mark.parametrize("runtime_answers", [True, False], ids=["filled-at-tiling", "empty-at-both"])
def test_cold_platform_at_compile_still_runs_and_equals_eager(runtime_answers):
    platform = PlatformInfo.empty(SOME_HOST, runtime_answers=runtime_answers)
    compiled = compile_graph(build(convert_block_attention_residuals, forward_specs(), -1, 1e-6, True),
                             HostRuntime(platform))
    assert not platform.filled  # TilingParse did not need it
    inputs = forward_inputs()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        outputs = compiled(*inputs)
    expected = torch.ops.attnres.block_attention_residuals(*inputs, -1, 1e-6, True)
    assert all(torch.equal(a, b) for a, b in zip(outputs, expected, strict=True))


@pytest.fixture(params=["cpp-node", "python"])
def runner(request):
    """How a compiled graph runs: through the C++ entry's GraphNode, or in Python with its nodes' BufferPools."""
    if request.param == "cpp-node" and not CPP_ENTRY:
        pytest.skip("the ops' C++ entry is not built")
    return request.param


def compile_for(runner: str, graph_def):
    compiled = compile_graph(graph_def)
    assert (compiled.node is not None) == CPP_ENTRY  # the backend's one-op graphs always get a node
    if runner == "python":
        compiled.node = None
    return compiled


def allocations(compiled, runner: str) -> int:
    return compiled.node.allocations() if runner == "cpp-node" else compiled.ops[0].buffers.allocations


@pytest.mark.parametrize(("bad", "named"), [(None, "None"), (1.5, "float")], ids=["none", "float"])
def test_a_graph_input_that_is_not_a_tensor_is_named(runner, bad, named):
    compiled = compile_for(runner, build(convert_block_attention_residuals, forward_specs(), -1, 1e-6, True))
    inputs = forward_inputs()
    compiled(*inputs)  # planned: a C++ node has the signature cached
    inputs[1] = bad
    with pytest.raises(GraphRunError, match=r"input 1 \(node 'input1'\) must be a torch.float32 tensor \[6, 3, 16\], "
                                            rf"got {named}"):
        compiled(*inputs)


def test_buffers_are_reused_only_when_nobody_holds_them(runner):
    compiled = compile_for(runner, build(convert_block_attention_residuals, forward_specs(), -1, 1e-6, True))
    inputs, other = forward_inputs(seed=0), forward_inputs(seed=1)
    held = compiled(*inputs)
    snapshot = [t.clone() for t in held]
    first_allocations = allocations(compiled, runner)  # 3 outputs + workspace
    again = compiled(*other)  # `held` is still alive: its memory must not be overwritten
    assert allocations(compiled, runner) > first_allocations
    assert all(torch.equal(a, b) for a, b in zip(held, snapshot, strict=True))
    view_of_probs = again[2][1:]
    del held, again
    before = allocations(compiled, runner)
    results = compiled(*inputs)  # only probs is still held (through a view): just it is allocated afresh
    assert allocations(compiled, runner) == before + 1
    expected = torch.ops.attnres.block_attention_residuals(*inputs, -1, 1e-6, True)
    assert all(torch.equal(a, b) for a, b in zip(results, expected, strict=True))
    assert view_of_probs.data_ptr() != 0


@pytest.mark.skipif(not CPP_ENTRY, reason="the ops' C++ entry is not built")
def test_the_cpp_node_leaves_the_python_kernels_to_python_and_forgets_on_a_switch():
    compiled = compile_graph(build(convert_block_attention_residuals, forward_specs(), -1, 1e-6, True))
    inputs = forward_inputs(seed=3)
    compiled(*inputs)
    assert compiled.node.planned_signatures() == 1
    try:
        op_kernel.KERNELS.set_implementation("python")
        assert compiled.node.planned_signatures() == 0  # the switch dropped the native launch
        results = compiled(*inputs)  # planned, but not repeatable in C++: the graph ran in Python
        assert compiled.node.planned_signatures() == 0 and len(compiled.ops[0].buffers) == 1
        expected = torch.ops.attnres.block_attention_residuals(*inputs, -1, 1e-6, True)  # Python kernels too
    finally:
        op_kernel.KERNELS.set_implementation(None)
    assert all(torch.equal(a, b) for a, b in zip(results, expected, strict=True))


@pytest.mark.skipif(not CPP_ENTRY, reason="the ops' C++ entry is not built")
def test_a_dropped_compiled_graph_is_freed_with_its_node():
    compiled = compile_graph(build(convert_block_attention_residuals, forward_specs(), -1, 1e-6, True))
    compiled(*forward_inputs())
    graph = weakref.ref(compiled)
    del compiled
    gc.collect()
    assert graph() is None  # the node holds its graph weakly: no cycle through C++


def test_tensors_off_the_cpu_are_refused_before_any_kernel_reads_them():
    compiled = compile_graph(build(convert_block_attention_residuals, forward_specs(), -1, 1e-6, True))
    compiled(*forward_inputs())  # the same shapes on the CPU first: planned (and cached by the C++ node)
    meta_inputs = [tensor.to("meta") for tensor in forward_inputs()]
    with pytest.raises(AttnResInputError, match=r"BlockAttentionResiduals .*CPU tensors only, got tensors on meta"):
        compiled(*meta_inputs)


def test_dump_writes_pbtxt_that_parses_back(tmp_path):
    graph_def = build(convert_block_attention_residuals, forward_specs(), -1, 1e-6, True)
    compile_graph(graph_def, dump_path=tmp_path / "dump")
    [dumped] = list((tmp_path / "dump").glob("*.pbtxt"))
    assert dumped.name.endswith("_test.pbtxt")
    assert text_format.Parse(dumped.read_text(), ge_ir.GraphDef()) == graph_def


def test_buffers_are_kept_for_a_bounded_number_of_shapes(runner):
    compiled = compile_for(runner, build(convert_block_attention_residuals, forward_specs(tokens=-1)))
    max_shapes = compiled.ops[0].buffers.max_shapes
    for tokens in range(2, 2 + 3 * max_shapes):
        compiled(*forward_inputs(tokens=tokens))
    kept = compiled.node.planned_signatures() if runner == "cpp-node" else len(compiled.ops[0].buffers)
    assert kept == max_shapes


def test_the_shape_used_last_keeps_its_buffers(runner):
    compiled = compile_for(runner, build(convert_block_attention_residuals, forward_specs(tokens=-1)))
    max_shapes = compiled.ops[0].buffers.max_shapes
    for tokens in range(2, 2 + max_shapes):
        compiled(*forward_inputs(tokens=tokens))
    compiled(*forward_inputs(tokens=2))  # the first shape, used again: now the most recent
    compiled(*forward_inputs(tokens=99))  # one shape too many: the least recently used one goes
    before = allocations(compiled, runner)
    compiled(*forward_inputs(tokens=2))
    assert allocations(compiled, runner) == before  # its buffers were kept
