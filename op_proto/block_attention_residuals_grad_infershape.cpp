/*!
 * \file block_attention_residuals_grad_infershape.cpp
 * \brief InferShape / InferDataType of BlockAttentionResidualsGrad. Accepts and rejects what the Python prototype
 *        (op_proto/block_attention_residuals_grad.py) does, including GE's unknown dims and unknown rank.
 */
#include "attnres_shape_check.h"
#include "register/op_impl_registry.h"

namespace ops {
namespace {
using attnres_ge::CheckDimRange;
using attnres_ge::CheckTensorShape;
using attnres_ge::DimsOf;

constexpr const char *OP_TYPE = "BlockAttentionResidualsGrad";
constexpr size_t INPUT_PARTIAL_BLOCK = 0;
constexpr size_t INPUT_BLOCK_RES = 1;
constexpr size_t INPUT_PROJ_WEIGHT = 2;
constexpr size_t INPUT_NORM_WEIGHT = 3;
constexpr size_t INPUT_GRAD_HIDDEN_STATES = 4;
constexpr size_t INPUT_INV_NORM = 5;
constexpr size_t INPUT_PROBS = 6;
constexpr size_t OUTPUT_GRAD_PARTIAL_BLOCK = 0;
constexpr size_t OUTPUT_GRAD_BLOCK_RES = 1;
constexpr size_t OUTPUT_GRAD_PROJ_WEIGHT = 2;
constexpr size_t OUTPUT_GRAD_NORM_WEIGHT = 3;
constexpr int64_t MIN_NUM_BLOCKS = 0;
constexpr int64_t MAX_NUM_BLOCKS = 128;
constexpr int64_t MIN_HIDDEN = 1;

ge::graphStatus InferShapeBlockAttentionResidualsGrad(gert::InferShapeContext *ctx)
{
    if (ctx == nullptr) {
        return ge::GRAPH_FAILED;
    }
    const gert::Shape *partial = ctx->GetInputShape(INPUT_PARTIAL_BLOCK);
    const gert::Shape *blockRes = ctx->GetInputShape(INPUT_BLOCK_RES);
    const int64_t unknown = attnres_ge::UNKNOWN_DIM;
    if (!CheckTensorShape(OP_TYPE, "partial_block", partial, "[T, H]", {unknown, unknown})) {
        return ge::GRAPH_FAILED;
    }
    const std::vector<int64_t> th = DimsOf(*partial, 2);
    const int64_t tokens = th[0];
    const int64_t hidden = th[1];
    if (!CheckDimRange(OP_TYPE, "partial_block", "H", "hidden size", hidden, MIN_HIDDEN, -1) ||
        !CheckTensorShape(OP_TYPE, "block_res", blockRes, "[T, N, H]", {tokens, unknown, hidden})) {
        return ge::GRAPH_FAILED;
    }
    const int64_t blocks = DimsOf(*blockRes, 3)[1];
    const int64_t rows = attnres_ge::RowsOf(blocks);
    if (!CheckDimRange(OP_TYPE, "block_res", "N", "completed blocks", blocks, MIN_NUM_BLOCKS, MAX_NUM_BLOCKS) ||
        !CheckTensorShape(OP_TYPE, "proj_weight", ctx->GetInputShape(INPUT_PROJ_WEIGHT), "[1, H]", {1, hidden}) ||
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
    const ge::DataType dtype = ctx->GetInputDataType(INPUT_PARTIAL_BLOCK);
    if (!attnres_ge::IsFloatDtype(dtype)) {
        OP_LOGE(OP_TYPE, "[InferDataType] partial_block must have dtype in (float16, bfloat16, float32), got %s (%d)",
                attnres_ge::DtypeText(dtype), static_cast<int>(dtype));
        return ge::GRAPH_FAILED;
    }
    const std::pair<size_t, const char *> sameAsPartial[] = {{INPUT_BLOCK_RES, "block_res"},
                                                             {INPUT_PROJ_WEIGHT, "proj_weight"},
                                                             {INPUT_NORM_WEIGHT, "norm_weight"},
                                                             {INPUT_GRAD_HIDDEN_STATES, "grad_hidden_states"}};
    for (const auto &[index, name] : sameAsPartial) {
        const ge::DataType got = ctx->GetInputDataType(index);
        if (got != dtype) {
            OP_LOGE(OP_TYPE, "[InferDataType] %s must have the dtype of partial_block (%s), got %s (%d)", name,
                    attnres_ge::DtypeText(dtype), attnres_ge::DtypeText(got), static_cast<int>(got));
            return ge::GRAPH_FAILED;
        }
    }
    const std::pair<size_t, const char *> float32Only[] = {{INPUT_INV_NORM, "inv_norm"}, {INPUT_PROBS, "probs"}};
    for (const auto &[index, name] : float32Only) {
        const ge::DataType got = ctx->GetInputDataType(index);
        if (got != ge::DT_FLOAT) {
            OP_LOGE(OP_TYPE, "[InferDataType] %s must have dtype float32, got %s (%d)", name,
                    attnres_ge::DtypeText(got), static_cast<int>(got));
            return ge::GRAPH_FAILED;
        }
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
