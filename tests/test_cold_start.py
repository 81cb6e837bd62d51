"""The cold start this project exists to avoid: the first float32 call of a fresh process must work."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading

import pytest
import torch
from conftest import make_inputs

import attnres_ge
from attnres_ge.ge_plugin.op_common import forget_cached_launches
from attnres_ge.op_kernel import launcher as runtime_module

FIRST_CALL = textwrap.dedent(
    """
    import warnings
    warnings.simplefilter("error")  # a platform fallback would be a warning: make it fail
    import torch, attnres_ge
    from attnres_ge.op_kernel.launcher import default_runtime
    T, N, H = {shape}
    assert not default_runtime().platform.filled, "the process platform must start empty"
    g = torch.Generator().manual_seed(0)
    partial = torch.randn(T, H, generator=g)
    blocks = torch.randn(T, N, H, generator=g)
    inv = torch.rand(T, N + 1, generator=g) + 0.5
    probs = torch.softmax(torch.randn(T, N + 1, generator=g), dim=-1)
    grads = torch.ops.attnres.block_attention_residuals_backward(
        partial, blocks, torch.randn(1, H, generator=g), torch.ones(H), torch.randn(T, H, generator=g), inv, probs)
    assert all(torch.isfinite(x).all() for x in grads)
    print("first call ok", default_runtime().platform)
    """
)


@pytest.mark.parametrize("shape", [(1, 1, 8), (64, 8, 2048), (300, 128, 33), (5, 0, 4096)],
                         ids=["T1-N1-H8", "T64-N8-H2048", "T300-N128-H33", "T5-N0-H4096"])
def test_first_action_of_a_fresh_process_is_a_float32_backward(shape):
    result = subprocess.run([sys.executable, "-c", FIRST_CALL.format(shape=shape)], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "first call ok PlatformInfo(host-cpu, filled" in result.stdout


def test_first_action_is_a_float32_training_step_in_eager():
    script = textwrap.dedent(
        """
        import warnings
        warnings.simplefilter("error")
        import torch, attnres_ge
        layer = attnres_ge.BlockAttnRes(96)
        partial = torch.randn(40, 96, requires_grad=True)
        blocks = torch.randn(40, 3, 96, requires_grad=True)
        layer(partial, blocks).square().mean().backward()
        assert layer.proj_weight.grad is not None and blocks.grad.shape == (40, 3, 96)
        print("step ok")
        """
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "step ok" in result.stdout


def test_eight_threads_making_their_first_call_at_once(monkeypatch):
    """A fresh (empty) runtime, eight threads each making its first call of a different shape at once."""
    fresh = runtime_module.HostRuntime(
        runtime_module.PlatformInfo(runtime_module.host_profile(), filled=False, runtime=runtime_module.host_profile)
    )
    monkeypatch.setattr(runtime_module, "_default", fresh)
    forget_cached_launches()  # so that every first call reaches the fresh runtime
    barrier = threading.Barrier(8)
    results: dict[int, object] = {}

    def first_call(index: int) -> None:
        inputs = make_inputs(8 + index, 1 + index % 3, 16 * (index + 1), seed=index)
        leaves = [t.clone().requires_grad_() for t in inputs]
        barrier.wait()
        try:
            attnres_ge.block_attention_residuals(*leaves).sum().backward()
            results[index] = leaves[1].grad
        except Exception as error:  # reported below with the thread's index
            results[index] = error

    threads = [threading.Thread(target=first_call, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    failures = {i: r for i, r in results.items() if isinstance(r, Exception)}
    assert not failures, failures
    assert len(results) == 8
    assert fresh.platform.filled
    for index, grad in results.items():  # each thread's answer equals a calm single-threaded one
        inputs = make_inputs(8 + index, 1 + index % 3, 16 * (index + 1), seed=index)
        leaves = [t.clone().requires_grad_() for t in inputs]
        attnres_ge.block_attention_residuals(*leaves).sum().backward()
        assert torch.equal(grad, leaves[1].grad), f"thread {index}"
