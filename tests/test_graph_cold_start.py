"""Cold start in graph mode: a fresh process whose first action compiles and runs a float32 training step."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

GRAPH_FIRST = textwrap.dedent(
    """
    import json, warnings
    import torch, attnres_ge
    from attnres_ge.op_host.tiling_base import PlatformFallbackWarning
    warnings.simplefilter("error", PlatformFallbackWarning)  # a platform fallback must fail the run
    from attnres_ge.op_kernel.launcher import default_runtime

    assert not default_runtime().platform.filled, "the process platform must start empty"
    shapes = {shapes}
    layer = attnres_ge.BlockAttnRes(shapes[0][2])

    def step(partial, block_res):
        return (layer(partial, block_res) ** 2).sum()

    def grads(fn, partial, block_res):
        for t in (partial, block_res, *layer.parameters()):
            t.grad = None
        loss = fn(partial, block_res)
        loss.backward()
        return [loss.detach(), partial.grad, block_res.grad, layer.proj_weight.grad, layer.norm_weight.grad]

    compiled = torch.compile(step, backend="attnres_ge")
    results = []
    for tokens, blocks, hidden in shapes:  # the very first thing: graph mode, float32, forward + backward
        g = torch.Generator().manual_seed(tokens)
        partial = torch.randn(tokens, hidden, generator=g).requires_grad_()
        block_res = torch.randn(tokens, blocks, hidden, generator=g).requires_grad_()
        graph = grads(compiled, partial, block_res)
        eager = grads(step, partial, block_res)
        results.append(all(torch.equal(a, b) for a, b in zip(graph, eager)))
    print(json.dumps(results))
    """
)


@pytest.mark.slow
@pytest.mark.parametrize(
    "shapes",
    [
        pytest.param([(7, 3, 40), (130, 3, 40)], id="T7-N3-H40-then-T130"),
        pytest.param([(513, 37, 64), (1, 37, 64)], id="T513-N37-H64-then-T1"),
    ],
)
def test_first_action_of_a_fresh_process_is_a_graph_training_step(shapes):
    env = {**os.environ, "ATTNRES_GE_STRICT_PLATFORM": "1"}  # no silent fallback either
    done = subprocess.run([sys.executable, "-c", GRAPH_FIRST.format(shapes=shapes)], capture_output=True, text=True,
                          timeout=240, env=env)
    assert done.returncode == 0, done.stderr[-4000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [True] * len(shapes), "graph differs from eager"
