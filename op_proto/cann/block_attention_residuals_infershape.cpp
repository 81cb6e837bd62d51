/*!
 * \file block_attention_residuals_infershape.cpp
 * \brief InferShape / InferDataType of BlockAttentionResiduals. Accepts and rejects what the Python prototype
 *        (op_proto/block_attention_residuals.py) does, including GE's unknown dims and unknown rank. inv_norm and
 *        probs (OPTIONAL outputs) are [T, N+1] float32 when need_backward is true, else empty ([0]).
 */
#include <cmath>

#include "attnres_shape_check.h"
#include "block_attention_residuals_io.h"
#include "register/op_impl_registry.h"

namespace ops {
namespace {
using attnres_ge::CheckTensorShape;
using namespace attnres_ge::block_attention_residuals_io;

struct ForwardAttrs {
    int64_t validBlockNum = VALID_BLOCK_NUM_ALL;
    float normEps = DEFAULT_NORM_EPS;
    bool needBackward = false;
};

ForwardAttrs ReadAttrs(const gert::RuntimeAttrs *attrs)
{
    ForwardAttrs read;
    if (attrs == nullptr) {
        return read;
    }
    if (const int64_t *valid = attrs->GetAttrPointer<int64_t>(ATTR_VALID_BLOCK_NUM)) read.validBlockNum = *valid;
    if (const float *eps = attrs->GetAttrPointer<float>(ATTR_NORM_EPS)) read.normEps = *eps;
    if (const bool *backward = attrs->GetAttrPointer<bool>(ATTR_NEED_BACKWARD)) read.needBackward = *backward;
    return read;
}

bool CheckProjWeight(const gert::Shape *proj, int64_t hidden)
{
    // [H] or [1, H]; any other rank is reported against [1, H].
    if (proj != nullptr && !attnres_ge::IsUnknownRank(*proj) && proj->GetDimNum() == 1) {
        return CheckTensorShape(OP_TYPE, "proj_weight", proj, "[H]", {hidden});
    }
    return CheckTensorShape(OP_TYPE, "proj_weight", proj, "[1, H]", {1, hidden});
}

bool CheckAttrs(const ForwardAttrs &attrs, int64_t blocks)
{
    if (!(std::isfinite(attrs.normEps) && attrs.normEps > 0.0F)) {
        OP_LOGE(OP_TYPE, "[InferShape] attribute norm_eps must be finite and > 0 (as float32), got %g",
                static_cast<double>(attrs.normEps));
        return false;
    }
    // An unknown N (-1) is checked when the shape is known, as in the Python prototype.
    const bool blocksKnown = blocks >= 0;
    if (attrs.validBlockNum != VALID_BLOCK_NUM_ALL && blocksKnown && attrs.validBlockNum != blocks) {
        OP_LOGE(OP_TYPE, "[InferShape] attribute valid_block_num is reserved and must be -1 or N = %ld, got %ld",
                blocks, attrs.validBlockNum);
        return false;
    }
    return true;
}

ge::graphStatus InferShapeBlockAttentionResiduals(gert::InferShapeContext *ctx)
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
    const ForwardAttrs attrs = ReadAttrs(ctx->GetAttrs());
    if (!CheckProjWeight(ctx->GetInputShape(INPUT_PROJ_WEIGHT), hidden) ||
        !CheckTensorShape(OP_TYPE, "norm_weight", ctx->GetInputShape(INPUT_NORM_WEIGHT), "[H]", {hidden}) ||
        !CheckAttrs(attrs, blocks)) {
        return ge::GRAPH_FAILED;
    }
    attnres_ge::SetShape(ctx->GetOutputShape(OUTPUT_HIDDEN_STATES), {tokens, hidden});
    const std::vector<int64_t> saved =
        attrs.needBackward ? std::vector<int64_t>{tokens, attnres_ge::RowsOf(blocks)} : std::vector<int64_t>{0};
    attnres_ge::SetShape(ctx->GetOutputShape(OUTPUT_INV_NORM), saved);  // absent optional outputs are skipped
    attnres_ge::SetShape(ctx->GetOutputShape(OUTPUT_PROBS), saved);
    return ge::GRAPH_SUCCESS;
}

ge::graphStatus InferDataTypeBlockAttentionResiduals(gert::InferDataTypeContext *ctx)
{
    if (ctx == nullptr) {
        return ge::GRAPH_FAILED;
    }
    ge::DataType dtype = ge::DT_UNDEFINED;
    if (!attnres_ge::CheckInputDtypes(OP_TYPE, ctx, INPUT_PARTIAL_BLOCK,
                                      {{INPUT_BLOCK_RES, "block_res"},
                                       {INPUT_PROJ_WEIGHT, "proj_weight"},
                                       {INPUT_NORM_WEIGHT, "norm_weight"}},
                                      {}, dtype)) {
        return ge::GRAPH_FAILED;
    }
    ctx->SetOutputDataType(OUTPUT_HIDDEN_STATES, dtype);
    ctx->SetOutputDataType(OUTPUT_INV_NORM, ge::DT_FLOAT);
    ctx->SetOutputDataType(OUTPUT_PROBS, ge::DT_FLOAT);
    return ge::GRAPH_SUCCESS;
}
}  // namespace

IMPL_OP_INFERSHAPE(BlockAttentionResiduals)
    .InferShape(InferShapeBlockAttentionResiduals)
    .InferDataType(InferDataTypeBlockAttentionResiduals);
}  // namespace ops
