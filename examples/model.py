"""A small causal language model with Block Attention Residuals (Kimi team, arXiv 2603.15031), on the stream.

The residual stream (`attnres_ge.ResidualStream`) follows the paper's and Kimi K3's schedule: it starts with the
token embeddings live and nothing sealed. Layer `l` reads its attention input from the stream (its BlockAttnRes
mixes the sealed block snapshots and the live block), seals the live block when `l % layers_per_block == 0` (layer
0 seals the embeddings: they are block 0), adds the attention output (the first output after a seal starts the new
live block), reads its MLP input and adds the MLP output. A last read feeds the LM head. Each read fuses the RMSNorm
that follows it (`read(mixer, output_norm=norm)` returns the sublayer's normed input). No read ever sees an
all-zero "partial block".

Activations are [B, S, H]; the stream and BlockAttnRes take the leading dims as they are. Everything but
BlockAttnRes is plain torch, so eager and graph mode run the same arithmetic. With a `KVCache` per layer the same
forward prefills a prompt and then decodes one token at a time (examples/generate.py); under `torch.no_grad()`
the stream then reads through the two-phase ops (one prepare per seal for the reads it declares).
"""
from __future__ import annotations

import math

import torch
from torch import nn

from attnres_ge import BlockAttnRes, ResidualStream

NORM_EPS = 1e-6


class KVCache:
    """One attention layer's keys and values of the tokens seen so far ([B, heads, S_past, head_dim] each)."""

    def __init__(self):
        self.keys: torch.Tensor | None = None
        self.values: torch.Tensor | None = None

    @property
    def length(self) -> int:
        return 0 if self.keys is None else self.keys.shape[-2]

    def extend(self, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.keys is not None:
            keys, values = torch.cat((self.keys, keys), dim=-2), torch.cat((self.values, values), dim=-2)
        self.keys, self.values = keys, values
        return keys, values


class CausalSelfAttention(nn.Module):
    """Multi-head causal attention written with plain matmul/softmax: [B, S, H] -> [B, S, H]."""

    def __init__(self, hidden: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(hidden, 3 * hidden, bias=False)
        self.out = nn.Linear(hidden, hidden, bias=False)

    def forward(self, x: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        batch, seq, hidden = x.shape
        head_dim = hidden // self.heads
        q, k, v = self.qkv(x).view(batch, seq, 3, self.heads, head_dim).permute(2, 0, 3, 1, 4)  # 3 x [B, h, S, d]
        past = 0
        if cache is not None:
            past = cache.length
            k, v = cache.extend(k, v)  # [B, h, past + S, d]
        scores = q @ k.transpose(-1, -2) / math.sqrt(head_dim)  # [B, h, S, past + S]
        # Query i sits at position past + i and sees keys 0 .. past + i.
        future = torch.ones(seq, past + seq, dtype=torch.bool, device=x.device).triu(1 + past)
        weights = scores.masked_fill(future, float("-inf")).softmax(-1)
        return self.out((weights @ v).transpose(1, 2).reshape(batch, seq, hidden))


class MLP(nn.Module):
    """[B, S, H] -> [B, S, H] through a SiLU hidden layer of 4H."""

    def __init__(self, hidden: int):
        super().__init__()
        self.up = nn.Linear(hidden, 4 * hidden, bias=False)
        self.down = nn.Linear(4 * hidden, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(nn.functional.silu(self.up(x)))


class Layer(nn.Module):
    """One layer: attention and MLP, each fed by its own BlockAttnRes read of the stream and an RMSNorm (fused
    into the read)."""

    def __init__(self, hidden: int, heads: int):
        super().__init__()
        self.attn_res = BlockAttnRes(hidden)
        self.attn_norm = nn.RMSNorm(hidden, eps=NORM_EPS)
        self.attn = CausalSelfAttention(hidden, heads)
        self.mlp_res = BlockAttnRes(hidden)
        self.mlp_norm = nn.RMSNorm(hidden, eps=NORM_EPS)
        self.mlp = MLP(hidden)


class BlockAttnResLM(nn.Module):
    """tokens [B, S] int64 -> logits [B, S, vocab]."""

    def __init__(self, vocab: int = 64, hidden: int = 32, layers: int = 4, layers_per_block: int = 2, heads: int = 2,
                 *, two_phase: bool | None = None):
        super().__init__()
        self.layers_per_block = layers_per_block
        self.two_phase = two_phase  # the stream's choice of read path (ResidualStream's two_phase)
        self.embed = nn.Embedding(vocab, hidden)
        self.layers = nn.ModuleList(Layer(hidden, heads) for _ in range(layers))
        self.final_res = BlockAttnRes(hidden)
        self.final_norm = nn.RMSNorm(hidden, eps=NORM_EPS)
        self.head = nn.Linear(hidden, vocab, bias=False)
        with torch.no_grad():  # a non-zero pseudo-query, so depth mixing is non-uniform from step 0
            for module in self.modules():
                if isinstance(module, BlockAttnRes):
                    module.proj_weight.normal_(std=0.02)

    @property
    def num_seals(self) -> int:
        """Layers 0, layers_per_block, 2 * layers_per_block, ... each seal once."""
        return -(-len(self.layers) // self.layers_per_block)

    def readers_after_seal(self, index: int) -> list[BlockAttnRes]:
        """The reads between the seal in layer `index` and the next seal, in order (the two-phase path batches
        their scoring of the snapshots into one prepare)."""
        end = min(index + self.layers_per_block, len(self.layers))
        readers = [self.layers[index].mlp_res]
        for later in range(index + 1, end):
            readers += [self.layers[later].attn_res, self.layers[later].mlp_res]
        readers.append(self.layers[end].attn_res if end < len(self.layers) else self.final_res)
        return readers

    def forward(self, tokens: torch.Tensor, caches: list[KVCache] | None = None) -> torch.Tensor:
        """tokens [B, S] -> logits [B, S, vocab]; `caches` (one KVCache per layer) holds the earlier tokens."""
        stream = ResidualStream(self.embed(tokens), max_blocks=self.num_seals, two_phase=self.two_phase)
        for index, layer in enumerate(self.layers):
            h = stream.read(layer.attn_res, output_norm=layer.attn_norm)
            if index % self.layers_per_block == 0:
                stream.seal(readers=self.readers_after_seal(index))
            stream.accumulate(layer.attn(h, None if caches is None else caches[index]))
            h = stream.read(layer.mlp_res, output_norm=layer.mlp_norm)
            stream.accumulate(layer.mlp(h))
        return self.head(stream.read(self.final_res, output_norm=self.final_norm))
