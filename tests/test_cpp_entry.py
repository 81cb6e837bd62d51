"""The torch ops' eager entry in C++ (ge_plugin/csrc): the first call of a signature runs the Python
entry, repeats run in C++ on the launch record it made, with the same bits; and without the extension
the Python registrations give the same results."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
import torch
from conftest import assert_bitwise_equal, make_inputs, python_frames

import attnres_ge
import attnres_ge.op_kernel as op_kernel
from attnres_ge.ge_plugin import op_common
from attnres_ge.op_proto import AttnResInputError

pytestmark = pytest.mark.skipif(not op_common.CPP_ENTRY, reason="the C++ eager entry is not built")

forward_op = torch.ops.attnres.block_attention_residuals.default
backward_op = torch.ops.attnres.block_attention_residuals_backward.default
update_op = torch.ops.attnres.block_attn_res_update.default
FORWARD_NAMES = ("hidden_states", "inv_norm", "probs")
BACKWARD_NAMES = ("grad_partial_block", "grad_block_res", "grad_proj_weight", "grad_norm_weight")


@pytest.fixture
def python_entry_calls(monkeypatch):
    """The op types the Python entry ran, in order (the C++ entry calls it only for signatures it has not
    cached, and for calls it must not update in place)."""
    calls = []
    for name in ("_launch", "_launch_in_place"):
        def spy(op, tensors, attrs, launch=getattr(op_common, name)):
            calls.append(op.op_type)
            return launch(op, tensors, attrs)

        monkeypatch.setattr(op_common, name, spy)
    return calls


def cached_launches() -> int:
    from attnres_ge.ge_plugin import _cpp_entry

    return _cpp_entry.cached_launches()


def test_a_repeated_signature_runs_in_cpp_with_the_first_calls_bits(python_entry_calls):
    inputs = make_inputs(21, 3, 72, seed=5)  # a signature no other test uses
    before = cached_launches()
    first = forward_op(*inputs, -1, 1e-6, True)
    assert python_entry_calls == ["BlockAttentionResiduals"] and cached_launches() == before + 1
    repeats = [forward_op(*inputs, -1, 1e-6, True) for _ in range(3)]
    assert python_entry_calls == ["BlockAttentionResiduals"]  # the repeats never entered Python
    for outputs in repeats:
        for name, a, b in zip(FORWARD_NAMES, outputs, first, strict=True):
            assert_bitwise_equal(name, a, b)
            assert a.data_ptr() != b.data_ptr()  # fresh outputs every call

    grad_hidden = torch.randn(21, 72)
    backward_inputs = (*inputs, grad_hidden, first[1], first[2])
    first_grads = backward_op(*backward_inputs)
    again = backward_op(*backward_inputs)
    assert python_entry_calls == ["BlockAttentionResiduals", "BlockAttentionResidualsGrad"]
    for name, a, b in zip(BACKWARD_NAMES, again, first_grads, strict=True):
        assert_bitwise_equal(name, a, b)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_repeats_in_16_bit_dtypes_and_without_statistics(dtype, python_entry_calls):
    inputs = make_inputs(9, 2, 40, dtype, seed=6)
    first = forward_op(*inputs, -1, 1e-6, False)
    again = forward_op(*inputs, -1, 1e-6, False)
    assert len(python_entry_calls) == 1
    assert again[1].shape == (0,) and again[2].shape == (0,)
    for name, a, b in zip(FORWARD_NAMES, again, first, strict=True):
        assert_bitwise_equal(name, a, b)


def test_non_contiguous_inputs_take_the_cached_launch(python_entry_calls):
    inputs = make_inputs(13, 2, 48, seed=7)
    first = forward_op(*inputs, -1, 1e-6, True)
    strided = inputs[0].t().contiguous().t()  # the same values, transposed layout
    again = forward_op(strided, *inputs[1:], -1, 1e-6, True)
    assert len(python_entry_calls) == 1
    for name, a, b in zip(FORWARD_NAMES, again, first, strict=True):
        assert_bitwise_equal(name, a, b)


def test_every_attribute_is_part_of_the_signature(python_entry_calls):
    inputs = make_inputs(11, 2, 32, seed=8)
    forward_op(*inputs, -1, 1e-6, True)
    forward_op(*inputs, -1, 1e-5, True)
    forward_op(*inputs, -1, 1e-6, False)
    assert len(python_entry_calls) == 3


def test_bad_input_is_refused_every_time_and_never_cached(python_entry_calls):
    partial, blocks, proj, norm = make_inputs(6, 2, 16)
    before = cached_launches()
    for _ in range(2):
        with pytest.raises(ValueError, match=r"BlockAttentionResiduals \(eager call\): block_res must have shape"):
            forward_op(partial, blocks[:, :, :8], proj, norm, -1, 1e-6, True)
        with pytest.raises(ValueError, match="norm_eps"):
            forward_op(partial, blocks, proj, norm, -1, -1.0, True)
    assert len(python_entry_calls) == 4 and cached_launches() == before


def test_python_kernels_are_never_repeated_from_the_cache(python_entry_calls):
    inputs = make_inputs(10, 2, 24, seed=9)
    forward_op(*inputs, -1, 1e-6, True)  # cached for the native kernels
    try:
        op_kernel.KERNELS.set_implementation("python")
        assert cached_launches() == 0  # switching forgets every cached launch
        forward_op(*inputs, -1, 1e-6, True)
        forward_op(*inputs, -1, 1e-6, True)
        assert cached_launches() == 0
    finally:
        op_kernel.KERNELS.set_implementation(None)
    assert len(python_entry_calls) == 3


def test_outputs_from_the_huge_page_pool_are_repeated_from_the_cache(python_entry_calls):
    from attnres_ge.ge_plugin import _cpp_entry

    pool = _cpp_entry.HugePagePool(1 << 40)
    previous = _cpp_entry.use_output_pool(pool, 1)  # every output now comes from the pool
    try:
        inputs = make_inputs(12, 2, 16, seed=10)
        first = forward_op(*inputs, -1, 1e-6, True)
        again = forward_op(*inputs, -1, 1e-6, True)
    finally:
        _cpp_entry.use_output_pool(*previous)
    assert len(python_entry_calls) == 1 and pool.mapped == 6
    for name, a, b in zip(FORWARD_NAMES, again, first, strict=True):
        assert_bitwise_equal(name, a, b)


def test_autograd_in_cpp_with_statistics_recomputed_when_not_saved():
    inputs = make_inputs(14, 3, 40, seed=11)
    grad_hidden = torch.randn(14, 40)
    grads = {}
    for need_backward in (True, False):
        leaves = [t.clone().requires_grad_() for t in inputs]
        hidden, inv_norm, probs = torch.ops.attnres.block_attention_residuals(*leaves, -1, 1e-6, need_backward)
        # The statistics are differentiable outputs when they are kept (tests/test_double_backward.py).
        assert inv_norm.requires_grad == probs.requires_grad == need_backward
        hidden.backward(grad_hidden)
        grads[need_backward] = [leaf.grad for leaf in leaves]
    for name, a, b in zip(("partial_block", "block_res", "proj_weight", "norm_weight"), *grads.values(), strict=True):
        assert_bitwise_equal(name, a, b)


def in_threads(work, count: int = 4) -> dict[int, object]:
    """work(index) on `count` threads at once; their results by index (all of them, or the test fails)."""
    results: dict[int, object] = {}
    threads = [threading.Thread(target=lambda i=i: results.__setitem__(i, work(i))) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert len(results) == count
    return results


def test_threads_repeating_a_cached_signature_get_the_same_bits():
    inputs = make_inputs(15, 2, 40, seed=13)
    expected = forward_op(*inputs, -1, 1e-6, True)  # planned and cached
    results = in_threads(lambda index: [forward_op(*inputs, -1, 1e-6, True) for _ in range(20)])
    for outputs in (outputs for runs in results.values() for outputs in runs):
        for name, a, b in zip(FORWARD_NAMES, outputs, expected, strict=True):
            assert_bitwise_equal(name, a, b)


def backward_inputs(tokens: int, blocks: int, hidden: int, seed: int) -> tuple[torch.Tensor, ...]:
    inputs = make_inputs(tokens, blocks, hidden, seed=seed)
    _, inv_norm, probs = forward_op(*inputs, -1, 1e-6, True)
    return (*inputs, torch.randn(tokens, hidden, generator=torch.Generator().manual_seed(seed)), inv_norm, probs)


def test_cached_backwards_reuse_their_threads_workspace_whatever_it_holds():
    from attnres_ge.ge_plugin import _cpp_entry

    small = backward_inputs(70, 2, 24, seed=15)  # two chunk rows of workspace
    large = backward_inputs(200, 2, 520, seed=16)  # four, each 20 times as wide: larger than any other test's
    expected_small = backward_op(*small)  # planned in Python, now cached
    expected_large = backward_op(*large)
    before = _cpp_entry.kept_workspace_allocations()
    large_repeats = [backward_op(*large) for _ in range(3)]
    after_large = _cpp_entry.kept_workspace_allocations()
    small_again = backward_op(*small)  # in a workspace the large calls have written
    assert after_large - before <= 1 and _cpp_entry.kept_workspace_allocations() == after_large
    for repeat in large_repeats:
        for name, a, b in zip(BACKWARD_NAMES, repeat, expected_large, strict=True):
            assert_bitwise_equal(name, a, b)
    for name, a, b in zip(BACKWARD_NAMES, small_again, expected_small, strict=True):
        assert_bitwise_equal(name, a, b)

    # Each thread its own workspace: none writes another's.
    results = in_threads(lambda index: [backward_op(*(small if (index + call) % 2 else large)) for call in range(10)])
    for index, runs in results.items():
        for call, grads in enumerate(runs):
            expected = expected_small if (index + call) % 2 else expected_large
            for name, a, b in zip(BACKWARD_NAMES, grads, expected, strict=True):
                assert_bitwise_equal(name, a, b)


def test_inference_mode_calls_take_the_cached_launch(python_entry_calls):
    inputs = make_inputs(7, 3, 24, seed=14)
    expected = forward_op(*inputs, -1, 1e-6, False)
    with torch.inference_mode():
        outputs = attnres_ge.block_attention_residuals(*inputs)
    assert len(python_entry_calls) == 1
    assert_bitwise_equal("hidden_states", outputs, expected[0])


PYTHON_ENTRY_SCRIPT = textwrap.dedent(
    """
    import sys
    sys.modules["attnres_ge.ge_plugin._cpp_entry"] = None  # as if the extension were not built
    import torch
    import attnres_ge
    from attnres_ge.ge_plugin import op_common
    assert not op_common.CPP_ENTRY
    sys.path.insert(0, {tests!r})
    from test_cpp_entry import STEP_SHAPE, training_step
    from conftest import make_inputs
    torch.save(training_step(), {path!r})
    inputs = [t.requires_grad_() for t in make_inputs(*STEP_SHAPE)]
    torch.library.opcheck(torch.ops.attnres.block_attention_residuals, (*inputs, -1, 1e-6, True))
    from attnres_ge.op_proto import AttnResInputError
    try:
        torch.ops.attnres.block_attention_residuals(inputs[0], None, *inputs[2:])
        raise SystemExit("None for block_res was accepted")
    except AttnResInputError as error:
        assert "block_res must be a tensor [T, N, H], got None" in str(error), error
    print("python entry ok")
    """
)


STEP_SHAPE = (17, 3, 56)  # T, N, H


def training_step() -> list[torch.Tensor]:
    """A training step's results through the public API: hidden_states and the four input gradients."""
    leaves = [t.requires_grad_() for t in make_inputs(*STEP_SHAPE, seed=12)]
    hidden = attnres_ge.block_attention_residuals(*leaves)
    hidden.backward(torch.linspace(-1, 1, hidden.numel()).reshape(hidden.shape))
    return [hidden.detach(), *[leaf.grad for leaf in leaves]]


@pytest.mark.slow
def test_without_the_extension_the_python_registrations_give_the_same_bits(tmp_path):
    path = tmp_path / "python_entry.pt"
    script = PYTHON_ENTRY_SCRIPT.format(tests=str(Path(__file__).parent), path=str(path))
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "python entry ok" in result.stdout
    expected = torch.load(path)
    for name, a, b in zip(("hidden_states", *BACKWARD_NAMES), training_step(), expected, strict=True):
        assert_bitwise_equal(name, a, b)


def update_arguments(tokens, hidden, seed):
    """block_attn_res_update's tensors for one prepared slot (a signature no other test uses per shape)."""
    generator = torch.Generator().manual_seed(seed)
    block_res = torch.randn(tokens, 3, hidden, generator=generator)
    queries = torch.randn(2, hidden, generator=generator) / hidden**0.5
    numerator, logit_max, exp_sum = (t[0].contiguous() for t in torch.ops.attnres.block_attn_res_prepare(
        block_res, torch.tensor([3], dtype=torch.uint64), queries))
    delta = torch.randn(tokens, hidden, generator=generator).to(torch.bfloat16)
    return torch.randn(tokens, hidden, generator=generator), delta, queries[1].clone(), numerator, logit_max, exp_sum


def test_a_repeated_update_runs_in_cpp_in_place(python_entry_calls):
    """The reference output: a repeat writes partial_block in place without Python, bumps its version, and
    gives the bits of the first call on the same inputs."""
    partial, *rest = update_arguments(11, 56, seed=31)
    start = partial.clone()
    first_h = update_op(partial, *rest)
    first_partial = partial.clone()
    assert python_entry_calls == ["BlockAttnResPrepare", "BlockAttnResUpdate"]
    for _ in range(2):
        partial.copy_(start)
        version, address = partial._version, partial.data_ptr()
        h = update_op(partial, *rest)
        assert python_entry_calls == ["BlockAttnResPrepare", "BlockAttnResUpdate"]  # the repeats stayed in C++
        assert partial.data_ptr() == address and partial._version > version
        assert_bitwise_equal("partial_block", partial, first_partial)
        assert_bitwise_equal("h", h, first_h)


def test_a_repeated_prepare_that_needs_no_gradient_runs_no_python():
    """Its Autograd kernel is C++: only a call that needs a gradient enters Python (the derivative), and a
    repeated signature's launch is C++ too; the outputs then carry autograd history only when they need it."""
    generator = torch.Generator().manual_seed(33)
    block_res, queries = torch.randn(2, 3, 40, generator=generator), torch.randn(4, 40, generator=generator)
    valid = torch.tensor([3], dtype=torch.uint64)
    prepare = torch.ops.attnres.block_attn_res_prepare
    first = prepare(block_res, valid, queries)
    for grad_mode in (torch.no_grad, torch.enable_grad):
        with grad_mode():
            assert python_frames(lambda: prepare(block_res, valid, queries)) == []
    differentiable = queries.clone().requires_grad_()
    frames = python_frames(lambda: prepare(block_res, valid, differentiable))
    assert any("_Differentiable" in frame for frame in frames), frames
    outputs = prepare(block_res, valid, differentiable)
    assert all(out.grad_fn is not None for out in outputs)
    for name, out, expected in zip(("numerator", "logit_max", "exp_sum"), outputs, first, strict=True):
        assert_bitwise_equal(name, out.detach(), expected)


def test_a_repeated_update_that_cannot_run_in_place_goes_to_python(python_entry_calls):
    """A non-contiguous partial_block (written back through a copy) and one that overlaps another argument
    (refused, naming both) take the Python entry even when their signature is cached."""
    partial, delta, query, numerator, logit_max, exp_sum = update_arguments(6, 40, seed=32)
    expected_partial = partial.clone()
    expected_h = update_op(expected_partial, delta, query, numerator, logit_max, exp_sum)
    calls = len(python_entry_calls)
    strided = torch.empty(40, 6).t()  # same shape and dtype, not contiguous
    strided.copy_(partial)
    h = update_op(strided, delta, query, numerator, logit_max, exp_sum)
    assert len(python_entry_calls) == calls + 1
    assert_bitwise_equal("partial_block (strided)", strided.contiguous(), expected_partial)
    assert_bitwise_equal("h", h, expected_h)
    with pytest.raises(AttnResInputError, match="partial_block is updated in place and must not share "
                                                           "memory with numerator"):
        update_op(numerator, delta, query, numerator, logit_max, exp_sum)
