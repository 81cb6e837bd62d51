"""ResidualStream against a float64 reference of the schedule (docs/using.md, "The residual stream"), on the general
read (grad mode), the per-layer path and, where the ops exist, the two-phase path: several block sizes, leading dims,
autocast, gradients, the fused output norm, several-query readers, the saved memory, misuse."""

from __future__ import annotations

import collections
import gc
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

from attnres_ge import BlockAttnRes, BlockAttnResReader, ResidualStream, block_attention_residuals, fused_attnres
from attnres_ge.examples.model import BlockAttnResLM
from attnres_ge.op_kernel.reference import general_read_reference
from attnres_ge.stream import two_phase_ops_available

needs_two_phase = pytest.mark.skipif(not two_phase_ops_available(), reason="the two-phase torch ops are not built")

HIDDEN = 16
EPS = 1e-6


# ---------------------------------------------------------------------------------- the float64 reference


def reference_read(sealed: list[torch.Tensor], live: torch.Tensor, proj: torch.Tensor, norm: torch.Tensor):
    """Softmax over depth of RMS-normalised scores; candidates: the sealed snapshots, then live."""
    candidates = torch.stack([*sealed, live])  # [n+1, ..., H]
    keys = candidates / candidates.square().mean(-1, keepdim=True).add(EPS).sqrt()
    scores = (keys * (norm * proj.reshape(-1))).sum(-1)  # [n+1, ...]
    weights = scores.softmax(dim=0).unsqueeze(-1)
    return (weights * candidates).sum(0)


def reference_stack(model: Stack, embeddings: torch.Tensor) -> torch.Tensor:
    """The K3 schedule written out with a Python list and a live tensor that a seal empties."""
    weights = model.float64_weights()
    sealed, live = [], embeddings
    for layer in range(model.layers):
        h = reference_read(sealed, live, *weights["attn_res"][layer])
        if layer % model.block_size == 0:
            sealed, live = [*sealed, live], None
        out = model.attn(layer, h, weights["attn"][layer])
        live = out if live is None else live + out
        h = reference_read(sealed, live, *weights["mlp_res"][layer])
        live = live + model.mlp(layer, h, weights["mlp"][layer])
    return reference_read(sealed, live, *weights["final_res"])


# ---------------------------------------------------------------------------------- a K3-style stack


class Stack(torch.nn.Module):
    """Layers of (read, seal every block_size layers, attention stand-in, read, MLP stand-in), a final read."""

    def __init__(self, layers: int, block_size: int, seed: int = 0):
        super().__init__()
        self.layers, self.block_size = layers, block_size
        generator = torch.Generator().manual_seed(seed)

        def weight(*shape, scale):
            return torch.nn.Parameter(torch.randn(*shape, generator=generator) * scale)

        def mixer():
            module = BlockAttnRes(HIDDEN, norm_eps=EPS)
            with torch.no_grad():
                module.proj_weight.copy_(torch.randn(1, HIDDEN, generator=generator))
                module.norm_weight.copy_(1 + 0.2 * torch.randn(HIDDEN, generator=generator))
            return module

        self.attn_res = torch.nn.ModuleList(mixer() for _ in range(layers))
        self.mlp_res = torch.nn.ModuleList(mixer() for _ in range(layers))
        self.final_res = mixer()
        self.attn_weights = torch.nn.ParameterList(weight(HIDDEN, HIDDEN, scale=0.3) for _ in range(layers))
        self.mlp_weights = torch.nn.ParameterList(weight(HIDDEN, HIDDEN, scale=0.3) for _ in range(layers))

    @staticmethod
    def attn(layer: int, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x @ weight)

    @staticmethod
    def mlp(layer: int, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.silu(x @ weight)

    def num_seals(self) -> int:
        return -(-self.layers // self.block_size)

    def readers_after_seal(self, layer: int) -> list[BlockAttnRes]:
        """The reads from this seal (in layer `layer`) to the next one, in order."""
        readers = [self.mlp_res[layer]]
        for later in range(layer + 1, min(layer + self.block_size, self.layers)):
            readers += [self.attn_res[later], self.mlp_res[later]]
        next_seal = layer + self.block_size
        readers.append(self.attn_res[next_seal] if next_seal < self.layers else self.final_res)
        return readers

    def forward(self, embeddings: torch.Tensor, two_phase=None, declare_readers=True, max_blocks="fit"):
        max_blocks = self.num_seals() if max_blocks == "fit" else max_blocks
        stream = ResidualStream(embeddings, max_blocks=max_blocks, two_phase=two_phase)
        self.spans_two_phase = []
        for layer in range(self.layers):
            h = stream.read(self.attn_res[layer])
            if layer % self.block_size == 0:
                stream.seal(readers=self.readers_after_seal(layer) if declare_readers else None)
                self.spans_two_phase.append(stream.two_phase_active)
            stream.accumulate(self.attn(layer, h, self.attn_weights[layer]))
            h = stream.read(self.mlp_res[layer])
            stream.accumulate(self.mlp(layer, h, self.mlp_weights[layer]))
        return stream.read(self.final_res)

    def float64_weights(self) -> dict:
        def pair(module):
            return module.proj_weight.double(), module.norm_weight.double()

        return {
            "attn_res": [pair(module) for module in self.attn_res],
            "mlp_res": [pair(module) for module in self.mlp_res],
            "final_res": pair(self.final_res),
            "attn": [weight.double() for weight in self.attn_weights],
            "mlp": [weight.double() for weight in self.mlp_weights],
        }


def embeddings_of(shape, seed=1) -> torch.Tensor:
    return torch.randn(*shape, HIDDEN, generator=torch.Generator().manual_seed(seed))


SCHEDULES = [  # (layers, block_size); the layer count a multiple of the block size: the last layer closes a block
    pytest.param(4, 1, id="4layers-block1"),
    pytest.param(4, 2, id="4layers-block2-closes"),
    pytest.param(5, 2, id="5layers-block2"),
    pytest.param(6, 3, id="6layers-block3-closes"),
    pytest.param(3, 4, id="3layers-block4-one-block"),
]


def assert_close_float32(actual: torch.Tensor, expected: torch.Tensor, what: str):
    # Several layers of float32 arithmetic (reads, matmuls) separate the stream from the float64 reference.
    torch.testing.assert_close(actual.double(), expected, rtol=1e-4, atol=1e-5, msg=lambda text: f"{what}: {text}")


# ---------------------------------------------------------------------------------- results


@pytest.mark.parametrize(("layers", "block_size"), SCHEDULES)
def test_per_layer_path_equals_the_float64_schedule(layers, block_size):
    model = Stack(layers, block_size)
    embeddings = embeddings_of((2, 3))
    expected = reference_stack(model, embeddings.double())
    with torch.no_grad():
        assert_close_float32(model(embeddings, two_phase=False), expected, "no grad")
        assert not any(model.spans_two_phase)
    assert_close_float32(model(embeddings, two_phase=False).detach(), expected, "grad mode")


@needs_two_phase
@pytest.mark.parametrize(("layers", "block_size"), SCHEDULES)
def test_two_phase_path_equals_the_float64_schedule_and_the_per_layer_path(layers, block_size):
    model = Stack(layers, block_size)
    embeddings = embeddings_of((2, 3))
    expected = reference_stack(model, embeddings.double())
    with torch.no_grad():
        two_phase = model(embeddings, two_phase=True)
        assert all(model.spans_two_phase) and len(model.spans_two_phase) == model.num_seals()
        automatic = model(embeddings)
        assert all(model.spans_two_phase), "two_phase=None takes the two-phase ops without grad when readers are named"
        per_layer = model(embeddings, two_phase=False)
    assert_close_float32(two_phase, expected, "two-phase")
    assert torch.equal(automatic, two_phase)
    torch.testing.assert_close(two_phase, per_layer, rtol=1e-4, atol=1e-5)


@needs_two_phase
def test_without_declared_readers_the_automatic_stream_reads_per_layer():
    model = Stack(4, 2)
    embeddings = embeddings_of((5,))
    with torch.no_grad(), torch.inference_mode():
        result = model(embeddings, declare_readers=False)
    assert not any(model.spans_two_phase)
    assert_close_float32(result, reference_stack(model, embeddings.double()), "undeclared readers")


@pytest.mark.parametrize("leading", [(), (7,), (2, 3), (2, 1, 3)], ids=["one-token", "T", "B-S", "three-dims"])
@pytest.mark.parametrize("two_phase", [False, pytest.param(True, marks=needs_two_phase)],
                         ids=["per-layer", "two-phase"])
def test_leading_dims(leading, two_phase):
    model = Stack(3, 2)
    embeddings = embeddings_of(leading)
    with torch.no_grad():
        result = model(embeddings, two_phase=two_phase)
    assert result.shape == (*leading, HIDDEN)
    assert_close_float32(result, reference_stack(model, embeddings.double()), f"leading dims {leading}")


def test_the_first_read_of_a_block_mixes_no_zero_row():
    """The bug this stream fixes: zero pseudo-queries give the plain average of the real candidates only."""
    embeddings, out = embeddings_of((4,)), embeddings_of((4,), seed=2)
    mixer = BlockAttnRes(HIDDEN)  # proj_weight zeros: uniform weights over the candidates
    stream = ResidualStream(embeddings)
    torch.testing.assert_close(stream.read(mixer), embeddings, rtol=0, atol=0)  # nothing sealed: live alone
    stream.seal()
    stream.accumulate(out)
    torch.testing.assert_close(stream.read(mixer), (embeddings + out) / 2, rtol=1e-6, atol=1e-6)


def test_a_growing_buffer_takes_more_seals_than_its_first_allocation():
    model = Stack(11, 1)  # 11 seals: more than the 8 slots a buffer without max_blocks starts with
    embeddings = embeddings_of((3,))
    with torch.no_grad():
        result = model(embeddings, two_phase=False, max_blocks=None)
    assert_close_float32(result, reference_stack(model, embeddings.double()), "grown buffer")


class OpCalls(TorchDispatchMode):
    """Records the attnres ops run under it, in order: (name, positional arguments)."""

    def __init__(self):
        super().__init__()
        self.calls = []

    @property
    def counts(self) -> collections.Counter:
        return collections.Counter(name for name, _ in self.calls)

    def snapshots(self) -> list[tuple[str, torch.Tensor]]:
        """(name, block_res) of each read op that takes the snapshots: the per-layer op and prepare."""
        return [(name, args[1] if name == "block_attention_residuals" else args[0]) for name, args in self.calls
                if name in ("block_attention_residuals", "block_attn_res_prepare")]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "attnres":
            self.calls.append((func.__name__.split(".")[0], args))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("two_phase", [False, pytest.param(True, marks=needs_two_phase)],
                         ids=["per-layer", "two-phase"])
def test_op_calls_follow_the_schedule(two_phase):
    """Per-layer: one op per read once something is sealed (the first read has one candidate: no op).
    Two-phase: one prepare per seal and one update per read after it."""
    model = Stack(5, 2)  # seals in layers 0, 2, 4; 11 reads, the first one before any seal
    with torch.no_grad(), OpCalls() as calls:
        model(embeddings_of((3,)), two_phase=two_phase)
    reads_after_a_seal = 2 * model.layers  # all reads (two per layer, one final) but the first
    if two_phase:
        expected = {"block_attn_res_prepare": model.num_seals(), "block_attn_res_update": reads_after_a_seal}
        assert calls.counts == expected
    else:
        assert calls.counts == {"block_attention_residuals": reads_after_a_seal}


def test_without_grad_the_snapshots_stay_in_one_preallocated_buffer():
    embeddings = embeddings_of((2, 3))
    with torch.no_grad():
        stream = ResidualStream(embeddings, max_blocks=3, two_phase=False)
        buffers = set()
        for seal in range(3):
            stream.seal()
            buffers.add(stream.snapshots.data_ptr())
            assert stream.snapshots.shape == (2, 3, 3, HIDDEN)
            stream.accumulate(embeddings_of((2, 3), seed=seal + 2))
    assert len(buffers) == 1


def test_without_grad_the_per_layer_adds_write_one_tensor_of_the_stream_and_hand_out_copies():
    """live + out goes into the stream's own tensor, in place from the second add on; a read of live alone (nothing
    sealed) hands out a copy, which later adds leave alone; the embeddings and outputs are never written."""
    embeddings, outs = embeddings_of((3,)), [embeddings_of((3,), seed=seed) for seed in (2, 3, 4)]
    given = [tensor.clone() for tensor in (embeddings, *outs)]
    mixer = BlockAttnRes(HIDDEN)
    with torch.no_grad():
        stream = ResidualStream(embeddings, two_phase=False)
        stream.accumulate(outs[0])
        own = stream.live
        first_read = stream.read(mixer)  # nothing sealed: live alone
        stream.accumulate(outs[1])
        assert stream.live is own
        stream.seal()
        stream.accumulate(outs[2])  # right after a seal: live is out itself
        stream.accumulate(outs[0])
        assert stream.live is own
    torch.testing.assert_close(first_read, embeddings + outs[0], rtol=0, atol=0)
    torch.testing.assert_close(stream.snapshots[:, 0], embeddings + outs[0] + outs[1], rtol=0, atol=0)
    torch.testing.assert_close(stream.live, outs[2] + outs[0], rtol=0, atol=0)
    for before, after in zip(given, (embeddings, *outs), strict=True):
        assert torch.equal(before, after)


@needs_two_phase
def test_prepare_reads_no_slot_beyond_the_sealed_ones(monkeypatch):
    """Prepare gets the whole buffer with valid_blocks = the sealed count: slots not sealed yet (NaN here) are
    never read."""
    def nan_buffer(self, slots, dtype, device):
        return torch.full((*self.shape[:-1], slots, self.shape[-1]), float("nan"), dtype=dtype, device=device)

    monkeypatch.setattr(ResidualStream, "_snapshot_buffer", nan_buffer)
    model = Stack(5, 2)
    embeddings = embeddings_of((4,))
    with torch.no_grad():
        result = model(embeddings, two_phase=True, max_blocks=6)  # 3 seals into 6 slots
    assert_close_float32(result, reference_stack(model, embeddings.double()), "NaN in the unsealed slots")


@needs_two_phase
def test_a_buffer_of_more_slots_than_prepare_takes_hands_it_the_sealed_ones():
    """max_blocks above prepare's limit of 64 snapshots: prepare gets the sealed slots (a copy), not the buffer."""
    model = Stack(5, 2)
    embeddings = embeddings_of((3,))
    with torch.no_grad():
        result = model(embeddings, two_phase=True, max_blocks=70)
    assert all(model.spans_two_phase)
    assert_close_float32(result, reference_stack(model, embeddings.double()), "max_blocks=70")


@pytest.mark.parametrize("two_phase", [False, pytest.param(True, marks=needs_two_phase)],
                         ids=["per-layer", "two-phase"])
def test_without_grad_no_read_copies_the_snapshots(two_phase):
    """The ops get contiguous snapshots (they would copy others on every call): prepare the whole buffer itself
    (valid_blocks names the sealed slots), per-layer reads one [..., n, H] copy per seal, shared by the span."""
    model = Stack(6, 2)  # 3 seals, 4 reads after each; the buffer's first two spans see a part of it
    with torch.no_grad(), OpCalls() as calls:
        result = model(embeddings_of((2, 3)), two_phase=two_phase)
    assert_close_float32(result, reference_stack(model, embeddings_of((2, 3)).double()), "stream")
    seen = calls.snapshots()
    assert all(tensor.is_contiguous() for _, tensor in seen)
    if two_phase:
        assert [name for name, _ in seen] == ["block_attn_res_prepare"] * 3
        assert len({tensor.data_ptr() for _, tensor in seen}) == 1  # the buffer, each time
        assert {tensor.shape[1] for _, tensor in seen} == {3}
    else:
        per_span = [seen[span * 4:(span + 1) * 4] for span in range(3)]
        for span, reads in enumerate(per_span):
            assert {tensor.shape[1] for _, tensor in reads} == {span + 1}
            assert len({tensor.data_ptr() for _, tensor in reads}) == 1


# ---------------------------------------------------------------------------------- the general read


def random_mixer(seed: int) -> BlockAttnRes:
    generator = torch.Generator().manual_seed(seed)
    mixer = BlockAttnRes(HIDDEN, norm_eps=EPS)
    with torch.no_grad():
        mixer.proj_weight.copy_(torch.randn(1, HIDDEN, generator=generator))
        mixer.norm_weight.copy_(1 + 0.2 * torch.randn(HIDDEN, generator=generator))
    return mixer


def random_norm(seed: int, eps=EPS) -> torch.nn.RMSNorm:
    norm = torch.nn.RMSNorm(HIDDEN, eps=eps)
    with torch.no_grad():
        norm.weight.copy_(1 + 0.3 * torch.randn(HIDDEN, generator=torch.Generator().manual_seed(seed)))
    return norm


def test_the_general_read_equals_the_per_layer_op_within_float32_tolerance():
    """The grad path's op (query proj_weight, key weight norm_weight, scale 1) against the per-layer op's formula:
    the result and every gradient."""
    mixer = random_mixer(seed=5)
    blocks = [embeddings_of((2, 3), seed=seed).requires_grad_() for seed in (6, 7, 8)]
    live = embeddings_of((2, 3), seed=9).requires_grad_()
    cotangent = embeddings_of((2, 3), seed=10)
    results = {}
    for name in ("general", "per-layer"):
        if name == "general":
            out = fused_attnres(mixer.proj_weight, [*blocks, live], mixer.norm_weight, rms_eps=EPS)
        else:
            out = block_attention_residuals(live, torch.stack(blocks, dim=-2), mixer.proj_weight, mixer.norm_weight,
                                            norm_eps=EPS)
        inputs = (*blocks, live, mixer.proj_weight, mixer.norm_weight)
        results[name] = (out, *torch.autograd.grad((out * cotangent).sum(), inputs))
    for index, (general, per_layer) in enumerate(zip(results["general"], results["per-layer"], strict=True)):
        scale = per_layer.abs().max().item()  # weight gradients sum over tokens (docs/contract.md, "How exact")
        torch.testing.assert_close(general, per_layer, rtol=1e-4, atol=1e-5 * max(scale, 1),
                                   msg=lambda text, index=index: f"output/gradient {index}: {text}")


class ReadArguments(TorchDispatchMode):
    """The sources of each block_attn_res_read run under it."""

    def __init__(self):
        super().__init__()
        self.sources = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.attnres.block_attn_res_read.default:
            self.sources.append(args[0])
        return func(*args, **(kwargs or {}))


def fused_schedule(stream: ResidualStream, mixers, norms, outs) -> list[torch.Tensor]:
    """Reads (each with its output norm) with nothing sealed, after one seal and after two; returns the reads."""
    reads = [stream.read(mixers[0], output_norm=norms[0])]
    stream.seal(readers=[mixers[1]])
    stream.accumulate(outs[0])
    reads.append(stream.read(mixers[1], output_norm=norms[1]))
    stream.seal(readers=[mixers[2]])
    stream.accumulate(outs[1])
    stream.accumulate(outs[2])
    reads.append(stream.read(mixers[2], output_norm=norms[2]))
    return reads


def fused_schedule_reference(embeddings, mixers, norms, outs) -> list[torch.Tensor]:
    snapshots = [[], [embeddings], [embeddings, outs[0]]]
    lives = [embeddings, outs[0], outs[1] + outs[2]]
    return [general_read_reference(mixer.proj_weight.double(), [*sealed, live], mixer.norm_weight.double(),
                                   norm.weight.double(), eps=EPS)[0]
            for mixer, norm, sealed, live in zip(mixers, norms, snapshots, lives, strict=True)]


@pytest.mark.parametrize("path", ["grad", "no-grad-per-layer", pytest.param("two-phase", marks=needs_two_phase)])
def test_a_fused_output_norm_returns_the_sublayers_normed_input(path):
    """Every path against the float64 general read; with grad its gradients too. Without grad the per-layer
    path's general reads get the buffer's slots where they lie (no copy); the two-phase path norms after the
    update (F.rms_norm)."""
    mixers, norms = [random_mixer(seed) for seed in (11, 12, 13)], [random_norm(seed) for seed in (14, 15, 16)]
    embeddings = embeddings_of((2, 3)).requires_grad_(path == "grad")
    outs = [embeddings_of((2, 3), seed=seed) for seed in (17, 18, 19)]
    with torch.set_grad_enabled(path == "grad"), ReadArguments() as calls:
        stream = ResidualStream(embeddings, max_blocks=2, two_phase=path == "two-phase")
        reads = fused_schedule(stream, mixers, norms, outs)
    assert stream.two_phase_active == (path == "two-phase")
    expected = fused_schedule_reference(embeddings.detach().double(), mixers, norms, [o.double() for o in outs])
    for index, (read, reference) in enumerate(zip(reads, expected, strict=True)):
        assert_close_float32(read.detach(), reference, f"read {index}")
    if path == "no-grad-per-layer":
        buffer = stream.snapshots.untyped_storage().data_ptr()
        assert [len(sources) for sources in calls.sources] == [1, 2, 3]
        assert all(source.untyped_storage().data_ptr() == buffer for sources in calls.sources[1:]
                   for source in sources[:-1])
    if path != "grad":
        return
    cotangents = [embeddings_of((2, 3), seed=seed) for seed in (20, 21, 22)]

    def loss(results):
        pairs = zip(results, cotangents, strict=True)
        return sum((result * cotangent.to(result.dtype)).sum() for result, cotangent in pairs)

    leaves = [embeddings, *(p for mixer in mixers for p in (mixer.proj_weight, mixer.norm_weight)),
              *(norm.weight for norm in norms)]
    actual = torch.autograd.grad(loss(reads), leaves)
    doubles = [leaf.detach().double().requires_grad_() for leaf in leaves]
    mixers64 = [SimpleNamespace(proj_weight=doubles[1 + 2 * i], norm_weight=doubles[2 + 2 * i]) for i in range(3)]
    norms64 = [SimpleNamespace(weight=weight) for weight in doubles[7:]]
    expected_reads = fused_schedule_reference(doubles[0], mixers64, norms64, [out.double() for out in outs])
    expected_grads = torch.autograd.grad(loss(expected_reads), doubles)
    for index, (grad, reference) in enumerate(zip(actual, expected_grads, strict=True)):
        scale = reference.abs().max().item()
        torch.testing.assert_close(grad.double(), reference, rtol=1e-4, atol=1e-4 * max(scale, 1e-2),
                                   msg=lambda text, index=index: f"gradient of leaf {index}: {text}")


def inkling2_style_reader(seed: int) -> BlockAttnResReader:
    reader = BlockAttnResReader(HIDDEN, queries=3, key_norm_weight=False, normalize_values=True,
                                scale=HIDDEN**-0.5, norm_eps=EPS)
    with torch.no_grad():
        reader.query.copy_(torch.randn(3, HIDDEN, generator=torch.Generator().manual_seed(seed)))
    return reader


@pytest.mark.parametrize("grad", [True, False], ids=["grad", "no-grad"])
def test_a_reader_of_several_queries_with_normalised_values(grad):
    """A BlockAttnResReader (three queries, unweighted keys, normalised values, a scale, one output norm per
    query) returns [3, ..., H], also with nothing sealed; a span it reads in takes no two-phase path."""
    readers, norms = [inkling2_style_reader(seed) for seed in (30, 31)], [random_norm(seed) for seed in (32, 33, 34)]
    embeddings, out = embeddings_of((2, 3)), embeddings_of((2, 3), seed=35)
    with torch.set_grad_enabled(grad):
        stream = ResidualStream(embeddings)
        first = stream.read(readers[0], output_norm=norms)
        stream.seal(readers=[readers[1]])
        assert not stream.two_phase_active
        stream.accumulate(out)
        second = stream.read(readers[1])
    gains = torch.stack([norm.weight for norm in norms]).double()
    options = dict(eps=EPS, scale=HIDDEN**-0.5, normalize_values=True)
    expected = [general_read_reference(readers[0].query.double(), [embeddings.double()], None, gains, **options),
                general_read_reference(readers[1].query.double(), [embeddings.double(), out.double()], **options)]
    for index, (read, reference) in enumerate(zip((first, second), expected, strict=True)):
        assert read.shape == (3, 2, 3, HIDDEN)
        assert_close_float32(read.detach(), reference, f"read {index}")
    if grad:
        second.sum().backward()
        assert readers[1].query.grad is not None and readers[1].query.grad.abs().max() > 0


@needs_two_phase
def test_two_phase_required_with_a_reader_among_the_readers_raises():
    with torch.no_grad():
        stream = ResidualStream(embeddings_of((3,)), two_phase=True)
        with pytest.raises(RuntimeError, match=r"ResidualStream\.seal: two_phase=True .*readers\[1\] are "
                                               r"BlockAttnResReader modules"):
            stream.seal(readers=[BlockAttnRes(HIDDEN), inkling2_style_reader(0)])


def saved_tensor_storages(forward) -> dict[int, int]:
    """{storage address: bytes} of the distinct storages the autograd graph of `forward()` saves, counting only
    [..., H] tensors (the depth statistics [T, L] of the reads grow with L by design and are H times smaller)."""
    storages = {}

    def pack(tensor):
        if tensor.dim() >= 2 and tensor.shape[-1] == HIDDEN:
            storages[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        result = forward()
    del result
    return storages


def test_in_grad_mode_each_snapshot_is_saved_once():
    """The saved [..., H] memory grows by the same amount per block (one seal per layer here): each snapshot is
    saved once, shared by the reads after it. Keeping a [..., n, H] stack per block would grow it quadratically."""
    embeddings = embeddings_of((4, 5))
    saved = {}
    for blocks in (3, 6, 9):  # L <= 10 sources: no statistic [T, L] ends in HIDDEN
        model = Stack(blocks, 1)
        saved[blocks] = sum(saved_tensor_storages(lambda model=model: model(embeddings)).values())
    assert saved[6] > saved[3]
    assert saved[9] - saved[6] == saved[6] - saved[3], f"saved bytes by blocks: {saved}"


# ---------------------------------------------------------------------------------- dtypes and gradients


@pytest.mark.parametrize("grad", [True, False], ids=["grad", "no-grad"])
def test_autocast_bfloat16(grad):
    model = Stack(4, 2)
    embeddings = embeddings_of((2, 3))
    with torch.set_grad_enabled(grad), torch.autocast("cpu", dtype=torch.bfloat16):
        result = model(embeddings)
    assert result.dtype == torch.bfloat16  # the dtype of the last accumulated output
    # bfloat16 matmuls in every sublayer: the tolerance of SPEC's bfloat16 row, widened for four layers.
    torch.testing.assert_close(result.double(), reference_stack(model, embeddings.double()), rtol=5e-2, atol=5e-2)
    if grad:
        result.float().square().sum().backward()
        assert model.attn_res[1].proj_weight.grad.dtype == torch.float32


@pytest.mark.parametrize(("layers", "block_size"), SCHEDULES[1:3])
def test_gradients_equal_the_float64_schedule(layers, block_size):
    model = Stack(layers, block_size)
    embeddings = embeddings_of((2, 3)).requires_grad_()
    cotangent = embeddings_of((2, 3), seed=3)
    (model(embeddings) * cotangent).sum().backward()

    reference_model = Stack(layers, block_size).double()
    reference_embeddings = embeddings.detach().double().requires_grad_()
    (reference_stack(reference_model, reference_embeddings) * cotangent.double()).sum().backward()

    actual = {"embeddings": embeddings.grad, **{name: p.grad for name, p in model.named_parameters()}}
    expected = {"embeddings": reference_embeddings.grad,
                **{name: p.grad for name, p in reference_model.named_parameters()}}
    for name, grad in actual.items():
        assert grad is not None, f"no gradient reached {name}"
        # Weight gradients sum over tokens: relative to the tensor's largest entry (docs/contract.md, "How exact").
        scale = expected[name].abs().max().item()
        torch.testing.assert_close(grad.double(), expected[name], rtol=1e-4, atol=1e-4 * max(scale, 1e-2),
                                   msg=lambda text, name=name: f"gradient of {name}: {text}")


# ---------------------------------------------------------------------------------- misuse


def test_reading_right_after_a_seal_raises():
    stream = ResidualStream(embeddings_of((3,)))
    stream.seal()
    with pytest.raises(RuntimeError, match=r"ResidualStream\.read: there is no live tensor since the last seal"):
        stream.read(BlockAttnRes(HIDDEN))
    with pytest.raises(RuntimeError, match=r"ResidualStream\.seal: there is no live tensor to seal"):
        stream.seal()


def test_accumulating_the_wrong_shape_raises():
    stream = ResidualStream(embeddings_of((3,)))
    with pytest.raises(ValueError, match=r"ResidualStream\.accumulate: out must have the embeddings' shape "
                                         r"\[3, 16\], got \[3, 8\]"):
        stream.accumulate(torch.zeros(3, 8))
    with pytest.raises(TypeError, match=r"ResidualStream\.accumulate: out must be a torch.Tensor, got list"):
        stream.accumulate([0.0] * HIDDEN)


def test_embeddings_that_are_no_tensor_or_0_d_raise():
    with pytest.raises(TypeError, match=r"ResidualStream: embeddings must be a torch.Tensor \[\.\.\., H\], got list"):
        ResidualStream([0.0])
    with pytest.raises(ValueError, match=r"ResidualStream: embeddings must be \[\.\.\., H\].*0-d tensor"):
        ResidualStream(torch.tensor(1.0))


def test_reading_with_something_else_than_a_block_attn_res_raises():
    stream = ResidualStream(embeddings_of((3,)))
    with pytest.raises(TypeError, match=r"ResidualStream\.read: mixer must be a BlockAttnRes or a "
                                        r"BlockAttnResReader, got Linear"):
        stream.read(torch.nn.Linear(HIDDEN, HIDDEN))


@pytest.mark.parametrize(("output_norm", "error", "message"), [
    (torch.ones(HIDDEN + 1), ValueError, r"output_norm must be a weight \[16\] or \[S, 16\], got \[17\]"),
    (torch.nn.RMSNorm(8), ValueError, r"output_norm must normalise the hidden size \(16,\), got normalized_shape"),
    ([torch.nn.RMSNorm(HIDDEN, eps=1e-6), torch.nn.RMSNorm(HIDDEN, eps=1e-5)], ValueError,
     r"the output_norm modules. eps differ"),
    (torch.nn.LayerNorm(HIDDEN), TypeError, r"output_norm must be None, a torch.nn.RMSNorm, .* got LayerNorm"),
], ids=["weight-shape", "module-shape", "eps-differ", "not-an-rmsnorm"])
def test_a_bad_output_norm_raises(output_norm, error, message):
    stream = ResidualStream(embeddings_of((3,)))
    with pytest.raises(error, match=r"ResidualStream\.read: " + message):
        stream.read(BlockAttnRes(HIDDEN), output_norm=output_norm)


@pytest.mark.parametrize("grad", [True, False], ids=["grad", "no-grad"])
def test_more_seals_than_max_blocks_raise(grad):
    with torch.set_grad_enabled(grad):
        stream = ResidualStream(embeddings_of((3,)), max_blocks=1, two_phase=False)
        stream.seal()
        stream.accumulate(embeddings_of((3,), seed=2))
        with pytest.raises(RuntimeError, match=r"ResidualStream\.seal: seal 2 exceeds max_blocks=1"):
            stream.seal()


def test_two_phase_required_with_grad_mode_on_raises():
    with pytest.raises(RuntimeError, match=r"ResidualStream: two_phase=True but the two-phase path cannot run: "
                                           r"(grad mode is on|.*not available)"):
        ResidualStream(embeddings_of((3,)), two_phase=True)


@needs_two_phase
def test_two_phase_required_without_declared_readers_raises():
    with torch.no_grad():
        stream = ResidualStream(embeddings_of((3,)), two_phase=True)
        with pytest.raises(RuntimeError, match=r"ResidualStream\.seal: two_phase=True .* not given the readers"):
            stream.seal()


@needs_two_phase
def test_an_empty_span_is_legal_on_a_two_phase_stream():
    """seal(readers=[]) declares that nothing reads before the next seal: no prepare, the outputs accumulated
    meanwhile fold into live, and the next span reads as a stream that sealed without declaring readers."""
    mixer = BlockAttnRes(HIDDEN)
    with torch.no_grad():
        streams = [ResidualStream(embeddings_of((3,)), two_phase=True), ResidualStream(embeddings_of((3,)))]
        for stream, readers in zip(streams, ([], None), strict=True):
            stream.seal(readers=readers)
            stream.accumulate(embeddings_of((3,), seed=2))
            stream.accumulate(embeddings_of((3,), seed=3))
        with pytest.raises(ValueError, match=r"read 0 expected no further read"):
            streams[0].read(mixer)
        reads = []
        for stream in streams:
            stream.seal(readers=[mixer])
            assert stream.two_phase_active
            stream.accumulate(embeddings_of((3,), seed=4))
            reads.append(stream.read(mixer))
    assert torch.equal(*reads)


@needs_two_phase
def test_a_read_out_of_the_declared_order_raises():
    first, second = BlockAttnRes(HIDDEN), BlockAttnRes(HIDDEN)
    with torch.no_grad():
        stream = ResidualStream(embeddings_of((3,)))
        stream.seal(readers=[first])
        stream.accumulate(embeddings_of((3,), seed=2))
        with pytest.raises(ValueError, match=r"ResidualStream\.read: .* read 0 expected readers\[0\]"):
            stream.read(second)
        stream.read(first)
        with pytest.raises(ValueError, match=r"read 1 expected no further read"):
            stream.read(first)


@needs_two_phase
def test_a_stream_built_without_grad_refuses_outputs_that_need_one():
    with torch.no_grad():
        stream = ResidualStream(embeddings_of((3,)))
    with pytest.raises(RuntimeError, match=r"ResidualStream\.accumulate: this stream was built without grad"):
        stream.accumulate(embeddings_of((3,)).requires_grad_())


def _two_ddp_steps() -> tuple[float, bool]:
    """Two training steps of a DDP-wrapped model: (layer 0's largest |proj_weight.grad|, whether every parameter
    has a gradient). The model, and with it DDP's reducer, is gone when this returns."""
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(BlockAttnResLM(layers=2, layers_per_block=1))
    tokens = torch.randint(0, 64, (2, 5))
    for _ in range(2):
        model(tokens).sum().backward()
    return (model.module.layers[0].attn_res.proj_weight.grad.abs().max().item(),
            all(parameter.grad is not None for parameter in model.parameters()))


def test_ddp_sees_every_mixer_used_even_the_one_candidate_read():
    """Layer 0's pre-attention read has one candidate; its mixer gets a zero gradient rather than none, so DDP
    (find_unused_parameters=False) does not fail on the next step for a parameter that received no gradient."""
    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    try:
        largest_grad, every_parameter_has_grad = _two_ddp_steps()
    finally:
        # The reducer died with the model, so the group's last reference goes here, where torch releases the
        # GIL to destroy it. Had the reducer held it to the end, the group would be destroyed with the GIL
        # held, and its gloo worker, which may need the GIL to free the work it ran, would never finish.
        gc.collect()
        dist.destroy_process_group()
    assert largest_grad == 0
    assert every_parameter_has_grad
