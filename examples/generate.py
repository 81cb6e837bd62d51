"""Generate with the Block AttnRes example model: prefill a prompt, then decode one token at a time.

    python -m attnres_ge.examples.generate --new-tokens 16

Each forward runs under torch.no_grad() on a `ResidualStream` whose seals name the reads that follow them, so the
stream reads through the two-phase ops (one `block_attn_res_prepare` per seal for all those reads, one
`block_attn_res_update` per read, then the sublayer's RMSNorm) when they are built, and otherwise through the
general read op with the RMSNorm fused (the model's reads all carry one). Attention keeps a `KVCache` per layer;
Block AttnRes mixes over depth, token by token, so a decode step's stream holds that token alone. Prints the
tokens and the time per token.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, field

import torch

from attnres_ge.examples.model import BlockAttnResLM, KVCache
from attnres_ge.stream import two_phase_ops_available


@dataclass
class Generation:
    prompt: torch.Tensor  # [B, S]
    tokens: torch.Tensor  # [B, new_tokens], greedy
    prefill_seconds: float
    decode_seconds: list[float] = field(default_factory=list)  # one per decoded token after the first

    @property
    def seconds_per_token(self) -> float:
        return sum(self.decode_seconds) / max(len(self.decode_seconds), 1)


def generate(model: BlockAttnResLM, prompt: torch.Tensor, new_tokens: int) -> Generation:
    """Greedy decoding: one prefill of `prompt` [B, S], then `new_tokens - 1` one-token steps on the KV caches."""
    caches = [KVCache() for _ in model.layers]
    with torch.no_grad():
        started = time.perf_counter()
        logits = model(prompt, caches)
        run = Generation(prompt, logits[:, -1:].argmax(-1), time.perf_counter() - started)
        for _ in range(new_tokens - 1):
            started = time.perf_counter()
            logits = model(run.tokens[:, -1:], caches)
            run.tokens = torch.cat((run.tokens, logits[:, -1:].argmax(-1)), dim=1)
            run.decode_seconds.append(time.perf_counter() - started)
    return run


def read_path() -> str:
    if two_phase_ops_available():
        return "two-phase ops (block_attn_res_prepare + block_attn_res_update)"
    return "general read op with the fused norm (the two-phase ops are not built)"


def report(run: Generation) -> str:
    lines = [f"reads through the {read_path()}"]
    for row, (prompt, tokens) in enumerate(zip(run.prompt.tolist(), run.tokens.tolist(), strict=True)):
        lines.append(f"  sequence {row}: prompt {prompt} -> {tokens}")
    lines.append(f"prefill of {run.prompt.shape[1]} tokens: {1e3 * run.prefill_seconds:.1f} ms; "
                 f"decode: {1e3 * run.seconds_per_token:.2f} ms per token")
    return "\n".join(lines)


def main(argv: list[str] | None = None, model: BlockAttnResLM | None = None) -> Generation:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--new-tokens", type=int, default=16, help="tokens to generate per sequence (default: 16)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the weights (without a trained model) and prompt")
    args = parser.parse_args(argv)
    torch.manual_seed(args.seed)
    model = BlockAttnResLM() if model is None else model
    prompt = torch.randint(0, model.embed.num_embeddings, (2, 4))
    run = generate(model.eval(), prompt, args.new_tokens)
    print(report(run))
    return run


if __name__ == "__main__":
    main()
