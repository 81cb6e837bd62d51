"""TilingParse and Tiling of the toy op ScaledAdd: one core walks every token."""

from __future__ import annotations

from dataclasses import dataclass

from attnres_ge.op_host.tiling_base import OpTiling, TilingRecord, TilingResult, as_float32, tiling_parse
from attnres_ge.op_proto.scaled_add import OP_TYPE, PROTOTYPE


@dataclass(frozen=True)
class ScaledAddTilingData(TilingRecord):
    tokens: int
    hidden: int
    alpha: float


def tiling(compile_info, inputs, attrs, platform) -> TilingResult:
    tokens, hidden = inputs["x"].shape
    record = ScaledAddTilingData(tokens, hidden, as_float32(attrs["alpha"]))
    return TilingResult(tiling_key=0, block_dim=1, data=record, workspace_size=0)


TILING = OpTiling(PROTOTYPE, ScaledAddTilingData, lambda platform: tiling_parse(OP_TYPE, platform), tiling)
