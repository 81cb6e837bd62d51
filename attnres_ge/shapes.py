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
