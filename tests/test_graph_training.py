"""The example model trained in eager and in graph mode from one seed: identical losses and parameters."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo

from attnres_ge.examples.train import TrainConfig, compare, report


@pytest.mark.slow
def test_example_model_trains_identically_in_eager_and_graph_mode():
    torch._dynamo.reset()
    config = TrainConfig(steps=3, batch=2, seq_len=8, layers=2, layers_per_block=1)
    runs = compare(config)
    eager, graph = runs["eager"], runs["graph"]
    assert graph.losses == eager.losses, report(runs)
    assert eager.losses[-1] < eager.losses[0], "the model should learn something in a few steps"
    eager_params = dict(eager.model.named_parameters())
    for name, parameter in graph.model.named_parameters():
        assert torch.equal(parameter, eager_params[name]), f"parameter {name} differs after training"
    assert "largest loss difference: 0.000e+00" in report(runs)
