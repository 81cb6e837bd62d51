"""What the command line's shapes and dtypes are spelled as, for `attnres-ge` and `attnres-ge bench` alike."""

from __future__ import annotations

import argparse

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def parse_shape(text: str) -> tuple[int, int, int]:
    """`T,N,H` -> (T, N, H); argparse's error for anything but three integers."""
    try:
        tokens, blocks, hidden = (int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--shape takes T,N,H (three integers), got {text!r}") from None
    return tokens, blocks, hidden


BLOCK_LETTERS = ("T", "N", "H")  # what a shape of three integers gives


def parse_dims(text: str) -> dict[str, int]:
    """A shape by letters: T,N,H (three integers) or LETTER=SIZE pairs, e.g. T=64,N=4,S=2,D=256."""
    parts = text.split(",")
    try:
        if all("=" in part for part in parts):
            return {letter.strip(): int(size) for letter, size in (part.split("=", 1) for part in parts)}
        if len(parts) == len(BLOCK_LETTERS):
            return dict(zip(BLOCK_LETTERS, (int(part) for part in parts), strict=True))
    except ValueError:
        pass
    raise argparse.ArgumentTypeError(f"--shape takes T,N,H (three integers) or LETTER=SIZE pairs, got {text!r}")
