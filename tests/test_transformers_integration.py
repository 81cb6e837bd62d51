"""attnres_ge.integrations.transformers.apply against transformers' own Inkling2 code.

- Tiny random Inkling2ForCausalLM and Inkling2LoopForCausalLM (no download; 4 layers, two blocks of two,
  full-attention layers, whose attention_input reads with 3 queries): after `apply`, logits, the gradient
  of every parameter and greedy `generate` tokens match a stock deep copy; parameters and state_dict are
  untouched; a second `apply` swaps nothing.
- One swapped module against the stock one (float32 and bfloat16 inputs, no sealed block, another eps).
- The op through a swapped module against transformers' Inkling2BlockAttentionResidual run at float64
  (its Tensor.float() redirected, as in test_general_read_reference.py): H = 37, 130 sources, rows at
  RMS 1e-3, 1 and 3 queries, every gradient; docs/contract.md's float32 tolerance.
Both sides of a model comparison compute in float32, so those compare within the float32 tolerance
(relative to the largest magnitude for the parameter gradients, sums over tokens).
"""

from __future__ import annotations

import copy
import io
import sys

import pytest
import torch
from test_general_read_peers import assert_within_float32, float32_leaves
from test_general_read_reference import _missing, float32_math_in_float64

import attnres_ge
from attnres_ge.integrations import transformers as integration
from attnres_ge.op_kernel.reference import max_violation

HIDDEN = 37
VOCAB = 64
TINY = dict(vocab_size=VOCAB, unpadded_vocab_size=VOCAB, hidden_size=32, num_hidden_layers=3, num_attention_heads=2,
            num_key_value_heads=1, head_dim=16, swa_num_attention_heads=2, swa_num_key_value_heads=1, swa_head_dim=16,
            sliding_window_size=8, d_rel=4, rel_extent=8, moe_intermediate_size=16, n_routed_experts=4,
            num_experts_per_tok=2, n_layers_per_attn_res_block=1, initializer_range=0.2, eos_token_id=None,
            layer_types=["hybrid_sliding", "hybrid", "hybrid_sliding"])
LOOP = dict(loop_layer_index_start=1, loop_layer_index_end=2, loop_num_passes=2, loop_gate_rank=8)


def _transformers_module(name: str):
    try:
        import importlib

        return importlib.import_module(f"transformers.models.{name}.modeling_{name}")
    except ImportError as error:
        _missing(f"transformers with {name} (>= 5.25) is not importable: {error}")


@pytest.fixture(scope="module")
def inkling2():
    return _transformers_module("inkling2")


def tiny_model(kind: str) -> torch.nn.Module:
    """A seeded tiny Inkling2 or Inkling2Loop causal LM in eval mode, its read queries random (they start at
    zero, where every depth weight is equal and a wrong scale or eps would not show)."""
    module = _transformers_module(kind)
    torch.manual_seed(0)
    if kind == "inkling2":
        model = module.Inkling2ForCausalLM(module.Inkling2TextConfig(**TINY))
    else:
        model = module.Inkling2LoopForCausalLM(module.Inkling2LoopTextConfig(**TINY, **LOOP))
    with torch.no_grad():
        for read in stock_reads(model):
            read.query.normal_()
    return model.eval()


def stock_reads(model: torch.nn.Module) -> list[torch.nn.Module]:
    stock = integration._stock_classes()
    return [module for module in model.modules() if type(module) in stock]


class Swapped:
    """A tiny model after `apply`, the stock deep copy made before, and what `apply` saw and returned."""

    def __init__(self, kind: str):
        self.model = tiny_model(kind)
        self.stock = copy.deepcopy(self.model)
        self.reads = stock_reads(self.model)
        self.parameters = dict(self.model.named_parameters())
        self.state = self.model.state_dict()
        self.count = integration.apply(self.model)


@pytest.fixture(scope="module", params=["inkling2", "inkling2_loop"])
def swapped(request) -> Swapped:
    return Swapped(request.param)


def token_ids(seed: int, batch: int = 2, tokens: int = 7) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, tokens), generator=torch.Generator().manual_seed(seed))


def assert_close_float32(name, actual, expected, *, whole_tensor=False):
    error, past = max_violation(actual, expected, torch.float32, whole_tensor=whole_tensor)
    assert past <= 0, f"{name}: the swapped model is off the stock one by {error:.3e} ({past:.3e} past tolerance)"


# ------------------------------------------------------------------------------------------------ models

def test_apply_swaps_every_read_in_place(swapped):
    assert swapped.count == len(swapped.reads) == len(stock_reads(swapped.stock)) > 0
    stock_classes = integration._stock_classes()
    for read in swapped.reads:
        assert isinstance(read, integration._FusedRead) and isinstance(read, stock_classes)
        assert type(read).__name__ == "Fused" + type(read).__mro__[2].__name__
    assert any(read.query.dim() == 2 and read.query.shape[0] == 3 for read in swapped.reads), "no 3-query read"
    assert dict(swapped.model.named_parameters()) == swapped.parameters  # the same Parameter objects
    state = swapped.model.state_dict()
    assert list(state) == list(swapped.state) == list(swapped.stock.state_dict())
    for name, tensor in state.items():
        assert tensor is swapped.state[name] or tensor.data_ptr() == swapped.state[name].data_ptr(), name
        assert torch.equal(tensor, swapped.stock.state_dict()[name]), name


def test_logits_and_every_parameter_gradient_match_stock(swapped):
    ids = token_ids(1)
    results = []
    for model in (swapped.model, swapped.stock):
        model.zero_grad()
        output = model(ids, labels=ids)
        output.loss.backward()
        results.append((output.logits.detach(), {name: p.grad for name, p in model.named_parameters()}))
    (logits, grads), (stock_logits, stock_grads) = results
    assert logits.dtype == stock_logits.dtype == torch.float32
    assert_close_float32("logits", logits, stock_logits)
    assert grads.keys() == stock_grads.keys()
    for name, grad in grads.items():
        assert (grad is None) == (stock_grads[name] is None), name
        if grad is not None:
            assert_close_float32(f"grad {name}", grad, stock_grads[name], whole_tensor=True)
    query_grads = [read.query.grad for read in swapped.reads]
    assert all(grad is not None and grad.abs().max() > 0 for grad in query_grads), "a read's query got no gradient"


def test_greedy_generate_matches_stock(swapped):
    ids = token_ids(2, batch=1, tokens=5)
    settings = dict(max_new_tokens=4, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        tokens = swapped.model.generate(ids, **settings)
        stock_tokens = swapped.stock.generate(ids, **settings)
    assert tokens.shape == (1, 9)
    assert torch.equal(tokens, stock_tokens)


def test_second_apply_swaps_nothing(swapped):
    """Documented: apply returns how many it swapped in this call, so 0 once all are swapped."""
    classes = [type(read) for read in swapped.reads]
    assert integration.apply(swapped.model) == 0
    assert [type(read) for read in swapped.reads] == classes


def test_apply_without_a_read_raises(inkling2):
    with pytest.raises(ValueError, match=r"apply: Linear has no Inkling2BlockAttentionResidual"):
        integration.apply(torch.nn.Linear(4, 4))
    with pytest.raises(TypeError, match=r"apply: model must be a torch.nn.Module, got str"):
        integration.apply("Inkling2ForCausalLM")


def test_apply_without_inkling2_says_what_to_install(monkeypatch):
    """transformers is imported by apply, not by the module: without Inkling2 apply says what to install."""
    for module_name, _ in integration._STOCK_READS:
        monkeypatch.setitem(sys.modules, module_name, None)  # import raises ImportError
    with pytest.raises(ImportError, match=r"apply needs transformers >= 5.25 .*pip install attnres-ge\[models\]"):
        integration.apply(torch.nn.Linear(4, 4))


# ------------------------------------------------------------------------------------------------ one module

def read_module(inkling2, queries: int, hidden: int = HIDDEN, attention: str = "eager"):
    config = inkling2.Inkling2TextConfig(hidden_size=hidden)
    config._attn_implementation = attention
    return inkling2.Inkling2BlockAttentionResidual(config, num_queries=queries)


def depth_inputs(blocks: int, queries: int, *, seed: int, lead=(2, 3)):
    """(query [S, H], block_states [*lead, N, H], partial [*lead, H]), float64; a third of the rows at RMS
    1e-3 (mean v^2 = eps), the others 0.1..10."""
    generator = torch.Generator().manual_seed(seed)
    uniform = torch.rand(*lead, blocks + 1, 1, generator=generator, dtype=torch.float64)
    scales = torch.where(uniform < 1 / 3, 1e-3, 10 ** (3 * uniform - 2))
    rows = torch.randn(*lead, blocks + 1, HIDDEN, generator=generator, dtype=torch.float64) * scales
    query = torch.randn(queries, HIDDEN, generator=generator, dtype=torch.float64)
    return query, rows[..., :-1, :].contiguous(), rows[..., -1, :].contiguous()


MODULE_CASES = {  # id: (queries, N, input dtype, the norm's eps)
    "S1-N3-float32": (1, 3, torch.float32, 1e-6),
    "S3-N3-float32": (3, 3, torch.float32, 1e-6),
    "S3-N0-float32": (3, 0, torch.float32, 1e-6),
    "S1-N4-bfloat16": (1, 4, torch.bfloat16, 1e-6),
    "S3-N2-float32-eps1e-3": (3, 2, torch.float32, 1e-3),
}


@pytest.mark.parametrize("case", MODULE_CASES.values(), ids=MODULE_CASES.keys())
def test_swapped_module_matches_stock_module(inkling2, monkeypatch, case):
    """Same tuple of S float32 tensors; the sealed blocks reach the op as views of block_states, not copies;
    the eps is the module norm's."""
    queries, blocks, dtype, eps = case
    query, block_states, partial = depth_inputs(blocks, queries, seed=blocks + queries)
    block_states, partial = block_states.to(dtype), partial.to(dtype)
    stock = read_module(inkling2, queries)
    stock.query.data = query.float().reshape(stock.query.shape)
    stock.norm.variance_epsilon = eps
    fused = copy.deepcopy(stock)
    assert integration.apply(fused) == 1

    seen = []

    def spy(query, residuals, *arguments, **keywords):
        seen.extend(residuals)
        return original(query, residuals, *arguments, **keywords)

    original = integration.fused_attnres
    monkeypatch.setattr(integration, "fused_attnres", spy)
    with torch.no_grad():
        outputs, expected = fused(block_states, partial), stock(block_states, partial)
    assert isinstance(outputs, tuple) and len(outputs) == len(expected) == queries
    for index, (output, wanted) in enumerate(zip(outputs, expected, strict=True)):
        assert output.shape == wanted.shape and output.dtype == wanted.dtype == torch.float32
        assert_close_float32(f"output {index}", output, wanted)
    assert len(seen) == blocks + 1
    if dtype == torch.float32:
        storage = block_states.untyped_storage().data_ptr()
        assert all(source.untyped_storage().data_ptr() == storage for source in seen[:-1]), "blocks were copied"
        assert seen[-1] is partial


def test_swapped_module_pickles(inkling2):
    """The swapped class is named at the integration module's level, so a swapped model unpickles."""
    fused = read_module(inkling2, 3)
    integration.apply(fused)
    buffer = io.BytesIO()
    torch.save(fused, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    assert type(loaded) is type(fused) and torch.equal(loaded.query, fused.query)


# ---------------------------------------------------------------------------------- the op at float64

@pytest.mark.parametrize("queries", [1, 3])
def test_op_against_inkling2_module_float64(inkling2, queries):
    """A swapped module (float32, the op) against the stock module at float64 on the same rounded values:
    the S outputs and the gradients of block_states, partial_block_states and the query."""
    query, block_states, partial = depth_inputs(129, queries, seed=queries)
    grad_out = torch.randn(queries, *partial.shape, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    (query32, blocks32, partial32), (query64, blocks64, partial64) = float32_leaves(query, block_states, partial)

    fused = read_module(inkling2, queries)
    integration.apply(fused)
    fused.query = torch.nn.Parameter(query32.detach().reshape(fused.query.shape))
    outputs = torch.stack(fused(blocks32, partial32))

    stock = read_module(inkling2, queries, attention="sdpa")  # eager's softmax is float32 whatever the inputs
    stock.query = torch.nn.Parameter(query64.detach().reshape(stock.query.shape))
    with float32_math_in_float64():
        expected = torch.stack(stock(blocks64, partial64))
    assert expected.dtype == torch.float64 and outputs.dtype == torch.float32
    assert_within_float32("outputs", outputs, expected.detach())

    grads = torch.autograd.grad(outputs, (blocks32, partial32, fused.query), grad_out.float())
    expected_grads = torch.autograd.grad(expected, (blocks64, partial64, stock.query), grad_out)
    for name, grad, wanted in zip(("block_states", "partial_block_states", "query"), grads, expected_grads,
                                  strict=True):
        assert_within_float32(f"grad {name}", grad, wanted, whole_tensor=True)  # as docs/contract.md states


def test_compiled_by_the_local_ge_equals_eager_bit_for_bit(inkling2):
    """torch.compile(backend=attnres_ge) of a patched Inkling2 model (the Loop variant's reads are the same
    module's): every read a BlockAttnResRead node of the local GE, the logits and every parameter gradient the
    same bits as eager."""
    swapped = Swapped("inkling2")
    ids = token_ids(2)

    def step(run):  # the compiled module shares swapped.model's parameters
        swapped.model.zero_grad()
        output = run(ids, labels=ids)
        output.loss.backward()
        return output.logits.detach(), {name: p.grad.clone() for name, p in swapped.model.named_parameters()
                                        if p.grad is not None}

    want_logits, want_grads = step(swapped.model)
    backend = attnres_ge.ge_backend()
    torch._dynamo.reset()
    try:
        got_logits, got_grads = step(torch.compile(swapped.model, backend=backend))
    finally:
        torch._dynamo.reset()
    assert torch.equal(got_logits, want_logits)
    assert got_grads.keys() == want_grads.keys()
    for name, grad in got_grads.items():
        assert torch.equal(grad, want_grads[name]), name
    node_types = [op.type for graph in backend.graphs for op in graph.op]
    assert node_types.count("BlockAttnResRead") == node_types.count("BlockAttnResReadGrad") == len(swapped.reads)
