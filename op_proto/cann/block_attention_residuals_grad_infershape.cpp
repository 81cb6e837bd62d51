/*!
 * \file block_attention_residuals_grad_infershape.cpp
 * \brief InferShape / InferDataType of BlockAttentionResidualsGrad. Accepts and rejects what the Python prototype
 *        (op_proto/block_attention_residuals_grad.py) does, including GE's unknown dims and unknown rank.
 */
#include "attnres_shape_check.h"
#include "block_attention_residuals_grad_io.h"
#include "register/op_impl_registry.h"

namespace ops {
namespace {
using attnres_ge::CheckTensorShape;
using namespace attnres_ge::block_attention_residuals_grad_io;


ge::graphStatus InferShapeBlockAttentionResidualsGrad(gert::InferShapeContext *ctx)
{
    if (ctx == nullptr) {
        return ge::GRAPH_FAILED;
    }
    attnres_ge::ValueDims dims;
    if (!attnres_ge::CheckValueShapes(OP_TYPE, ctx->GetInputShape(INPUT_PARTIAL_BLOCK),
                                      ctx->GetInputShape(INPUT_BLOCK_RES), MIN_NUM_BLOCKS, MAX_NUM_BLOCKS, dims)) {
        return ge::GRAPH_FAILED;
    }
    const int64_t tokens = dims.tokens;
    const int64_t blocks = dims.blocks;
    const int64_t hidden = dims.hidden;
    const int64_t rows = attnres_ge::RowsOf(blocks);
    if (!CheckTensorShape(OP_TYPE, "proj_weight", ctx->GetInputShape(INPUT_PROJ_WEIGHT), "[1, H]", {1, hidden}) ||
        !CheckTensorShape(OP_TYPE, "norm_weight", ctx->GetInputShape(INPUT_NORM_WEIGHT), "[H]", {hidden}) ||
        !CheckTensorShape(OP_TYPE, "grad_hidden_states", ctx->GetInputShape(INPUT_GRAD_HIDDEN_STATES), "[T, H]",
                          {tokens, hidden}) ||
        !CheckTensorShape(OP_TYPE, "inv_norm", ctx->GetInputShape(INPUT_INV_NORM), "[T, N+1]", {tokens, rows}) ||
        !CheckTensorShape(OP_TYPE, "probs", ctx->GetInputShape(INPUT_PROBS), "[T, N+1]", {tokens, rows})) {
        return ge::GRAPH_FAILED;
    }
    attnres_ge::SetShape(ctx->GetOutputShape(OUTPUT_GRAD_PARTIAL_BLOCK), {tokens, hidden});
    attnres_ge::SetShape(ctx->GetOutputShape(OUTPUT_GRAD_BLOCK_RES), {tokens, blocks, hidden});
    attnres_ge::SetShape(ctx->GetOutputShape(OUTPUT_GRAD_PROJ_WEIGHT), {1, hidden});
    attnres_ge::SetShape(ctx->GetOutputShape(OUTPUT_GRAD_NORM_WEIGHT), {hidden});
    return ge::GRAPH_SUCCESS;
}

ge::graphStatus InferDataTypeBlockAttentionResidualsGrad(gert::InferDataTypeContext *ctx)
{
    if (ctx == nullptr) {
        return ge::GRAPH_FAILED;
    }
    ge::DataType dtype = ge::DT_UNDEFINED;
    if (!attnres_ge::CheckInputDtypes(OP_TYPE, ctx, INPUT_PARTIAL_BLOCK,
                                      {{INPUT_BLOCK_RES, "block_res"},
                                       {INPUT_PROJ_WEIGHT, "proj_weight"},
                                       {INPUT_NORM_WEIGHT, "norm_weight"},
                                       {INPUT_GRAD_HIDDEN_STATES, "grad_hidden_states"}},
                                      {{INPUT_INV_NORM, "inv_norm"}, {INPUT_PROBS, "probs"}}, dtype)) {
        return ge::GRAPH_FAILED;
    }
    for (size_t output : {OUTPUT_GRAD_PARTIAL_BLOCK, OUTPUT_GRAD_BLOCK_RES, OUTPUT_GRAD_PROJ_WEIGHT,
                          OUTPUT_GRAD_NORM_WEIGHT}) {
        ctx->SetOutputDataType(output, dtype);
    }
    return ge::GRAPH_SUCCESS;
}
}  // namespace

IMPL_OP_INFERSHAPE(BlockAttentionResidualsGrad)
    .InferShape(InferShapeBlockAttentionResidualsGrad)
    .InferDataType(InferDataTypeBlockAttentionResidualsGrad);
}  // namespace ops
