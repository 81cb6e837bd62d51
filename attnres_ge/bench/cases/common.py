"""What the case families share: the norm's epsilon and how an op is compiled for the graph providers."""

from __future__ import annotations

import functools

import torch

NORM_EPS = 1e-6


def compiled_op(op, **attributes):
    """`op` under torch.compile(backend="attnres_ge") with a fresh dynamo cache: dynamo's recompile limit would
    otherwise silently fall back to eager after a few cases."""
    torch._dynamo.reset()
    return torch.compile(functools.partial(op, **attributes), backend="attnres_ge", fullgraph=True, dynamic=False)
