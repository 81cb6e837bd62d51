"""Train the Block AttnRes example model on CPU in eager and in graph mode, side by side.

    python -m attnres_ge.examples.train --steps 8

Both runs start from the same seed and see the same batches; graph mode is
`torch.compile(model, backend="attnres_ge")` (AOTAutograd; the stream's reads are the general read,
whose forward and backward become BlockAttnResRead / BlockAttnResReadGrad nodes of the local GE).
Prints both loss curves, their difference (0.0 when bit-identical) and the time per step of
each mode (graph mode's first step, which compiles, is reported apart).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, field

import torch

import attnres_ge  # noqa: F401  (registers the ops and the "attnres_ge" backend)
from attnres_ge.examples.model import BlockAttnResLM

MODES = ("eager", "graph")


@dataclass
class TrainConfig:
    steps: int = 8
    seed: int = 0
    batch: int = 4
    seq_len: int = 16
    vocab: int = 64
    hidden: int = 32
    layers: int = 4
    layers_per_block: int = 2
    lr: float = 3e-3
    dtype: torch.dtype = torch.float32


@dataclass
class TrainRun:
    mode: str
    losses: list[float] = field(default_factory=list)
    step_seconds: list[float] = field(default_factory=list)
    model: torch.nn.Module | None = None

    @property
    def first_step_seconds(self) -> float:
        return self.step_seconds[0]

    @property
    def steady_step_seconds(self) -> float:
        """Mean over all steps but the first (which compiles in graph mode)."""
        rest = self.step_seconds[1:] or self.step_seconds
        return sum(rest) / len(rest)


def make_batches(config: TrainConfig) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(inputs [B, S], targets [B, S]) per step: sequences following x_{i+1} = (5 x_i + 3) mod vocab."""
    generator = torch.Generator().manual_seed(config.seed + 1)
    batches = []
    for _ in range(config.steps):
        start = torch.randint(0, config.vocab, (config.batch, 1), generator=generator)
        sequence = [start]
        for _ in range(config.seq_len):
            sequence.append((5 * sequence[-1] + 3) % config.vocab)
        tokens = torch.cat(sequence, dim=1)  # [B, S+1]
        batches.append((tokens[:, :-1], tokens[:, 1:]))
    return batches


def train(mode: str, config: TrainConfig) -> TrainRun:
    """Train a freshly seeded model for `config.steps` steps in `mode` ("eager" or "graph")."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    torch.manual_seed(config.seed)
    model = BlockAttnResLM(config.vocab, config.hidden, config.layers, config.layers_per_block).to(config.dtype)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, foreach=False)
    forward = torch.compile(model, backend="attnres_ge") if mode == "graph" else model
    run = TrainRun(mode, model=model)
    for inputs, targets in make_batches(config):
        started = time.perf_counter()
        logits = forward(inputs)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        run.step_seconds.append(time.perf_counter() - started)
        run.losses.append(loss.item())
    return run


def compare(config: TrainConfig) -> dict[str, TrainRun]:
    """Both modes from the same seed: {"eager": run, "graph": run}."""
    return {mode: train(mode, config) for mode in MODES}


def report(runs: dict[str, TrainRun]) -> str:
    """The two loss curves side by side, their difference, and time per step."""
    eager, graph = runs["eager"], runs["graph"]
    lines = [f"{'step':>4}  {'eager loss':>12}  {'graph loss':>12}  {'difference':>11}"]
    for step, (a, b) in enumerate(zip(eager.losses, graph.losses, strict=True)):
        lines.append(f"{step:>4}  {a:>12.6f}  {b:>12.6f}  {b - a:>11.3e}")
    worst = max(abs(b - a) for a, b in zip(eager.losses, graph.losses, strict=True))
    lines.append(f"largest loss difference: {worst:.3e}" + ("  (bit-identical)" if worst == 0 else ""))
    for run in (eager, graph):
        lines.append(f"{run.mode:>5}: {1e3 * run.steady_step_seconds:8.1f} ms/step after the first; "
                     f"first step {1e3 * run.first_step_seconds:8.1f} ms")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, TrainRun]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=TrainConfig.steps)
    parser.add_argument("--seed", type=int, default=TrainConfig.seed)
    args = parser.parse_args(argv)
    runs = compare(TrainConfig(steps=args.steps, seed=args.seed))
    print(report(runs))
    return runs


if __name__ == "__main__":
    main()
