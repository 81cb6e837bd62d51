"""attnres_ge.integrations.transformers.apply against transformers' own Inkling2 code.

- Tiny random Inkling2ForCausalLM (3 layers, one per block) and Inkling2LoopForCausalLM (4 layers, layers 1-2
  looped twice: the second pass's message reads by both loop layers' queries), no download, whose
  attention_input reads with 3 queries: after `apply`, logits, the gradient of every parameter and greedy
  `generate` tokens match a stock deep copy; every read (the message read included) is swapped and counted;
  parameters and state_dict are untouched; a second `apply` swaps nothing.
- One swapped module against the stock one: the block read (float32 and bfloat16 inputs, no sealed block,
  another eps) and Inkling2Loop's message read (the model's call shapes, odd ones, eager and sdpa).
- The op through a swapped module against transformers' module run at float64 (its Tensor.float()
  redirected, as in test_general_read_reference.py): H = 37, 130 sources, rows at RMS 1e-3, 1 and 3 queries
  and a loop layer's 4 messages, every gradient; docs/contract.md's float32 tolerance.
- torch.compile(backend=attnres_ge) of a patched Inkling2 model and of a message read: the same bits as eager.
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
# Two loop layers, so that the second pass reads messages by both of message_input's query sets, from one
# sealed block of the first pass and its output (N = 1: with one loop layer N = 0 and the depth softmax is 1).
LOOP = dict(TINY, num_hidden_layers=4, layer_types=["hybrid_sliding", "hybrid", "hybrid_sliding", "hybrid"],
            loop_layer_index_start=1, loop_layer_index_end=3, loop_num_passes=2, loop_gate_rank=8)


def _transformers_module(name: str):
    try:
        import importlib

        return importlib.import_module(f"transformers.models.{name}.modeling_{name}")
    except ImportError as error:
        _missing(f"transformers with {name} (>= 5.25) is not importable: {error}")


@pytest.fixture(scope="module")
def inkling2():
    return _transformers_module("inkling2")


@pytest.fixture(scope="module")
def inkling2_loop():
    return _transformers_module("inkling2_loop")


def tiny_model(kind: str) -> torch.nn.Module:
    """A seeded tiny Inkling2 or Inkling2Loop causal LM in eval mode, its read queries random (they start at
    zero, where every depth weight is equal and a wrong scale or eps would not show)."""
    module = _transformers_module(kind)
    torch.manual_seed(0)
    if kind == "inkling2":
        model = module.Inkling2ForCausalLM(module.Inkling2TextConfig(**TINY))
    else:
        model = module.Inkling2LoopForCausalLM(module.Inkling2LoopTextConfig(**LOOP))
    with torch.no_grad():
        for read in stock_reads(model):
            read.query.normal_()
    return model.eval()


def stock_reads(model: torch.nn.Module) -> list[torch.nn.Module]:
    stock = integration._stock_reads()
    return [module for module in model.modules() if type(module) in stock]


class Swapped:
    """A tiny model after `apply`, the stock deep copy made before, and what `apply` saw and returned."""

    def __init__(self, kind: str):
        self.kind = kind
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
    stock_reads_by_class = integration._stock_reads()
    stock_names = []
    for read in swapped.reads:
        forward, stock = type(read).__bases__
        assert isinstance(read, integration._FusedRead) and stock_reads_by_class[stock] is forward
        assert type(read).__name__ == "Fused" + stock.__name__
        stock_names.append(stock.__name__)
    assert any(read.query.dim() == 2 and read.query.shape[0] == 3 for read in swapped.reads), "no 3-query read"
    # Inkling2Loop's model has one message read (message_input), counted with its block reads
    assert stock_names.count("Inkling2LoopMessageAttentionResidual") == (swapped.kind == "inkling2_loop")
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
    for read in swapped.reads:  # each query of every read (both loop layers' 4 of the message read) has one
        grad = read.query.grad
        assert grad is not None and (grad.reshape(-1, grad.shape[-1]).abs().amax(-1) > 0).all(), \
            f"a query of {type(read).__name__} got no gradient"


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
    for module_name, *_ in integration._STOCK_READS:
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


def message_module(inkling2_loop, attention: str = "eager"):
    """Inkling2LoopMessageAttentionResidual of a model with LOOP's two loop layers: query [2, 4, H]."""
    config = inkling2_loop.Inkling2LoopTextConfig(**dict(LOOP, hidden_size=HIDDEN))
    config._attn_implementation = attention
    return inkling2_loop.Inkling2LoopMessageAttentionResidual(config)


def spy_on_sources(monkeypatch) -> list[torch.Tensor]:
    """The list that every source the integration passes to fused_attnres is appended to."""
    seen = []
    original = integration.fused_attnres

    def spy(query, residuals, *arguments, **keywords):
        seen.extend(residuals)
        return original(query, residuals, *arguments, **keywords)

    monkeypatch.setattr(integration, "fused_attnres", spy)
    return seen


def assert_sources_are_the_inputs(seen, block_states, partial):
    """The sealed blocks reached the op as views of block_states (not copies), the partial block as itself."""
    storage = block_states.untyped_storage().data_ptr()
    assert all(source.untyped_storage().data_ptr() == storage for source in seen[:-1]), "blocks were copied"
    assert seen[-1] is partial


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

    seen = spy_on_sources(monkeypatch)
    with torch.no_grad():
        outputs, expected = fused(block_states, partial), stock(block_states, partial)
    assert isinstance(outputs, tuple) and len(outputs) == len(expected) == queries
    for index, (output, wanted) in enumerate(zip(outputs, expected, strict=True)):
        assert output.shape == wanted.shape and output.dtype == wanted.dtype == torch.float32
        assert_close_float32(f"output {index}", output, wanted)
    assert len(seen) == blocks + 1
    if dtype == torch.float32:
        assert_sources_are_the_inputs(seen, block_states, partial)


MESSAGE_CASES = {  # id: (leading dims, N, input dtype, the norm's eps, stock attention)
    "B2-T7-N1-eager": ((2, 7), 1, torch.float32, 1e-6, "eager"),  # the tiny Loop model's calls
    "B1-T1-N1-sdpa": ((1, 1), 1, torch.float32, 1e-6, "sdpa"),  # a decoding step's
    "B2-T5-N0-sdpa": ((2, 5), 0, torch.float32, 1e-6, "sdpa"),  # one loop layer: nothing sealed in the pass
    "B2-T5-N4-eager": ((2, 5), 4, torch.float32, 1e-6, "eager"),
    "B2-T3-N2-bfloat16-sdpa": ((2, 3), 2, torch.bfloat16, 1e-6, "sdpa"),
    "B2-T3-N2-eps1e-3-eager": ((2, 3), 2, torch.float32, 1e-3, "eager"),
}


@pytest.mark.parametrize("case", MESSAGE_CASES.values(), ids=MESSAGE_CASES.keys())
def test_swapped_message_module_matches_stock_module(inkling2_loop, monkeypatch, case):
    """Each loop layer's 4 messages: the stock's shape [..., 4, H] and dtype (float32), within the float32
    tolerance, on rows where eps matters; sealed blocks as views; the eps is the module norm's."""
    lead, blocks, dtype, eps, attention = case
    query, block_states, partial = depth_inputs(blocks, 8, seed=blocks + len(lead), lead=lead)
    block_states, partial = block_states.to(dtype), partial.to(dtype)
    stock = message_module(inkling2_loop, attention)
    stock.query.data = query.float().reshape(stock.query.shape)
    stock.norm.variance_epsilon = eps
    fused = copy.deepcopy(stock)
    assert integration.apply(fused) == 1 and integration.apply(fused) == 0

    seen = spy_on_sources(monkeypatch)
    for loop_layer in range(stock.query.shape[0]):
        seen.clear()
        with torch.no_grad():
            messages = fused(block_states, partial, loop_layer)
            expected = stock(block_states, partial, loop_layer)
        assert messages.shape == expected.shape == (*lead, 4, HIDDEN)
        assert messages.dtype == expected.dtype == torch.float32
        assert_close_float32(f"loop layer {loop_layer}'s messages", messages, expected)
        assert len(seen) == blocks + 1
        if dtype == torch.float32:
            assert_sources_are_the_inputs(seen, block_states, partial)


@pytest.mark.parametrize("kind", ["block", "message"])
def test_swapped_module_pickles(inkling2, inkling2_loop, kind):
    """The swapped class is named at the integration module's level, so a swapped model unpickles."""
    fused = read_module(inkling2, 3) if kind == "block" else message_module(inkling2_loop)
    integration.apply(fused)
    buffer = io.BytesIO()
    torch.save(fused, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    assert type(loaded) is type(fused) and torch.equal(loaded.query, fused.query)


# ---------------------------------------------------------------------------------- the op at float64

def assert_op_matches_stock_at_float64(fused, stock, call):
    """`fused` (swapped: float32, the op) against `stock` at float64 on the same rounded values: the output
    of call(module, block_states, partial_block_states) and the gradients of its inputs and of the query."""
    queries = fused.query.numel() // HIDDEN
    query, block_states, partial = depth_inputs(129, queries, seed=queries)
    (query32, blocks32, partial32), (query64, blocks64, partial64) = float32_leaves(query, block_states, partial)
    integration.apply(fused)
    fused.query = torch.nn.Parameter(query32.detach().reshape(fused.query.shape))
    outputs = call(fused, blocks32, partial32)
    stock.query = torch.nn.Parameter(query64.detach().reshape(stock.query.shape))
    with float32_math_in_float64():
        expected = call(stock, blocks64, partial64)
    assert expected.dtype == torch.float64 and outputs.dtype == torch.float32
    assert_within_float32("outputs", outputs, expected.detach())

    grad_out = torch.randn(expected.shape, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    grads = torch.autograd.grad(outputs, (blocks32, partial32, fused.query), grad_out.float())
    expected_grads = torch.autograd.grad(expected, (blocks64, partial64, stock.query), grad_out)
    for name, grad, wanted in zip(("block_states", "partial_block_states", "query"), grads, expected_grads,
                                  strict=True):
        assert_within_float32(f"grad {name}", grad, wanted, whole_tensor=True)  # as docs/contract.md states


@pytest.mark.parametrize("queries", [1, 3])
def test_op_against_inkling2_module_float64(inkling2, queries):
    """The S outputs of Inkling2BlockAttentionResidual (its sdpa form: eager's softmax is float32 whatever
    the inputs)."""
    assert_op_matches_stock_at_float64(read_module(inkling2, queries), read_module(inkling2, queries, attention="sdpa"),
                                       lambda module, blocks, partial: torch.stack(module(blocks, partial)))


def test_op_against_inkling2_loop_message_module_float64(inkling2_loop):
    """The second loop layer's 4 messages (the first's queries get a zero gradient on both sides)."""
    assert_op_matches_stock_at_float64(message_module(inkling2_loop), message_module(inkling2_loop, "sdpa"),
                                       lambda module, blocks, partial: module(blocks, partial, 1))


def test_compiled_by_the_local_ge_equals_eager_bit_for_bit(inkling2):
    """torch.compile(backend=attnres_ge) of a patched Inkling2 model (the Loop variant's block reads are the
    same module's, its message read the next test's): every read a BlockAttnResRead node of the local GE, the
    logits and every parameter gradient the same bits as eager."""
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


def test_message_module_compiled_by_the_local_ge_equals_eager_bit_for_bit(inkling2_loop):
    """torch.compile(backend=attnres_ge) of a swapped Inkling2LoopMessageAttentionResidual: one BlockAttnResRead
    and one BlockAttnResReadGrad node, the messages and the gradients of both inputs and the query the same
    bits as eager."""
    fused = message_module(inkling2_loop)
    query, block_states, partial = depth_inputs(2, 8, seed=3, lead=(2, 5))
    fused.query.data = query.float().reshape(fused.query.shape)
    integration.apply(fused)
    block_states, partial = block_states.float().requires_grad_(), partial.float().requires_grad_()
    grad_out = torch.randn(2, 5, 4, HIDDEN, generator=torch.Generator().manual_seed(6))

    def step(run):
        messages = run(block_states, partial, 1)
        return messages.detach(), torch.autograd.grad(messages, (block_states, partial, fused.query), grad_out)

    want_messages, want_grads = step(fused)
    backend = attnres_ge.ge_backend()
    torch._dynamo.reset()
    try:
        got_messages, got_grads = step(torch.compile(fused, backend=backend))
    finally:
        torch._dynamo.reset()
    assert torch.equal(got_messages, want_messages)
    for name, grad, wanted in zip(("block_states", "partial_block_states", "query"), got_grads, want_grads,
                                  strict=True):
        assert torch.equal(grad, wanted), name
    node_types = [op.type for graph in backend.graphs for op in graph.op]
    assert node_types.count("BlockAttnResRead") == node_types.count("BlockAttnResReadGrad") == 1
