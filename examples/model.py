"""A small causal language model with Block Attention Residuals (Kimi team, arXiv 2603.15031).

Layers are grouped into blocks of `layers_per_block`. The token embedding is the first completed
block. Before each sublayer (attention, then MLP) a `BlockAttnRes` mixes the completed blocks
[T, N, H] and the current partial block [T, H] (the running sum of this block's sublayer outputs,
zero at a block's start) with a learned softmax over depth; the sublayer reads RMSNorm of that
mix and adds its output to the partial block. When a block's layers are done, the partial block
joins the completed blocks. A last BlockAttnRes feeds the output norm and the LM head.

All tensors are [B, S, H] in the sublayers and flattened to [T = B*S, ...] for BlockAttnRes.
Everything but BlockAttnRes is plain torch, so eager and graph mode run the same arithmetic.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from attnres_ge import BlockAttnRes


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * weight, over the last dim."""

    def __init__(self, hidden: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class CausalSelfAttention(nn.Module):
    """Multi-head causal attention written with plain matmul/softmax: [B, S, H] -> [B, S, H]."""

    def __init__(self, hidden: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(hidden, 3 * hidden, bias=False)
        self.out = nn.Linear(hidden, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, hidden = x.shape
        head_dim = hidden // self.heads
        q, k, v = self.qkv(x).view(batch, seq, 3, self.heads, head_dim).permute(2, 0, 3, 1, 4)  # 3 x [B, h, S, d]
        scores = q @ k.transpose(-1, -2) / math.sqrt(head_dim)  # [B, h, S, S]
        future = torch.ones(seq, seq, dtype=torch.bool, device=x.device).triu(1)
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


class Sublayer(nn.Module):
    """BlockAttnRes over depth -> RMSNorm -> attention or MLP."""

    def __init__(self, hidden: int, body: nn.Module):
        super().__init__()
        self.attn_res = BlockAttnRes(hidden)
        self.norm = RMSNorm(hidden)
        self.body = body

    def forward(self, partial: torch.Tensor, blocks: torch.Tensor, shape: torch.Size) -> torch.Tensor:
        """partial [T, H], blocks [T, N, H] -> this sublayer's output [T, H]."""
        mixed = self.attn_res(partial, blocks).view(shape)  # [B, S, H]
        return self.body(self.norm(mixed)).flatten(0, 1)


class BlockAttnResLM(nn.Module):
    """tokens [B, S] int64 -> logits [B, S, vocab]."""

    def __init__(self, vocab: int = 64, hidden: int = 32, layers: int = 4, layers_per_block: int = 2, heads: int = 2):
        super().__init__()
        self.layers_per_block = layers_per_block
        self.embed = nn.Embedding(vocab, hidden)
        self.sublayers = nn.ModuleList()
        for _ in range(layers):
            self.sublayers.append(Sublayer(hidden, CausalSelfAttention(hidden, heads)))
            self.sublayers.append(Sublayer(hidden, MLP(hidden)))
        self.final_res = BlockAttnRes(hidden)
        self.final_norm = RMSNorm(hidden)
        self.head = nn.Linear(hidden, vocab, bias=False)
        with torch.no_grad():  # a non-zero pseudo-query, so depth mixing is non-uniform from step 0
            for module in self.modules():
                if isinstance(module, BlockAttnRes):
                    module.proj_weight.normal_(std=0.02)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        shape = (*tokens.shape, self.embed.embedding_dim)  # [B, S, H]
        completed = [self.embed(tokens).flatten(0, 1)]  # block 0: the embedding, [T, H]
        partial = torch.zeros_like(completed[0])
        sublayers_per_block = 2 * self.layers_per_block
        for index, sublayer in enumerate(self.sublayers):
            partial = partial + sublayer(partial, torch.stack(completed, dim=1), shape)
            if (index + 1) % sublayers_per_block == 0:
                completed.append(partial)
                partial = torch.zeros_like(partial)
        if len(self.sublayers) % sublayers_per_block == 0:  # the last block just closed
            partial = completed.pop()
        hidden = self.final_res(partial, torch.stack(completed, dim=1)).view(shape)
        return self.head(self.final_norm(hidden))
