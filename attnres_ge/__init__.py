"""attnres-ge: Block Attention Residuals ops for PyTorch eager and torchair/GE graph mode.

    import attnres_ge
    hidden = attnres_ge.block_attention_residuals(partial_block, block_res, proj_weight, norm_weight)
    stream = attnres_ge.ResidualStream(embeddings)   # a model's residual stream: read / seal / accumulate

Importing defines torch.ops.attnres.<name> for every op of the registry (ge_plugin/ops.py): the training
pair block_attention_residuals / block_attention_residuals_backward and the two-phase pair
block_attn_res_prepare / block_attn_res_update.

The subpackages, each importing only those before it (tests/test_layers.py checks it):

    op_proto    GE prototypes (InferDataType/InferShape: every entry point's validation)
    op_host     platform, TilingParse/Tiling, tiling records
    op_kernel   CPU kernels (native C++ and the Python oracle), then the launcher above them:
                plans per input signature, output buffers, the huge-page pool
    ge_plugin   the op registry (ops.py), torch ops and autograd, graph mode (converters, local GE,
                torch.compile backend), the NPU dispatch
    attnres_ge  this entry: the public API (api.py), the CLI and its benchmark; and examples
"""

from attnres_ge._checkout import installed_in_place_of_checkout

__version__ = "0.1.0"

__all__ = [
    "BlockAttnRes",
    "BlockAttnResReader",
    "ResidualStream",
    "block_attention_residuals",
    "block_attention_residuals_reference",
    "fused_attnres",
    "ge_backend",
]

if not installed_in_place_of_checkout(__name__, __path__):
    from attnres_ge.api import BlockAttnRes, block_attention_residuals
    from attnres_ge.ge_plugin import ge_backend
    from attnres_ge.op_kernel.reference import block_attention_residuals_reference
    from attnres_ge.read import BlockAttnResReader, fused_attnres
    from attnres_ge.stream import ResidualStream
