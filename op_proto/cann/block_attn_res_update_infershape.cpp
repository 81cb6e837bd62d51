/*!
 * \file block_attn_res_update_infershape.cpp
 * \brief InferShape / InferDataType of BlockAttnResUpdate. Accepts and rejects what the Python prototype
 *        (op_proto/block_attn_res_update.py) does with the OpDef's dtypes, including GE's unknown dims (-1) and
 *        unknown rank ([-2]): partial_block (the reference output, the input updated in place) and h are
 *        [T, D], float32 and delta's dtype (bfloat16, the OpDef's only one). On every valid input the outputs equal
 *        CANN's InferShape (which copies partial_block's shape and checks nothing); beyond CANN it checks that
 *        every input matches [T, D] / [D] / [T], 0 <= D <= 8192, the dtypes and eps.
 */
#include "attnres_shape_check.h"
#include "block_attn_res_update_io.h"
#include "register/op_impl_registry.h"

namespace ops {
namespace {
using attnres_ge::CheckTensorShape;
using attnres_ge::UNKNOWN_DIM;
using namespace attnres_ge::block_attn_res_update_io;

float ReadEps(const gert::RuntimeAttrs *attrs)
{
    const float *eps = attrs == nullptr ? nullptr : attrs->GetAttrPointer<float>(ATTR_EPS);
    return eps == nullptr ? DEFAULT_EPS : *eps;
}

ge::graphStatus InferShapeBlockAttnResUpdate(gert::InferShapeContext *ctx)
{
    if (ctx == nullptr) {
        OP_LOGE(OP_TYPE, "[InferShape] infer shape context is null");
        return ge::GRAPH_FAILED;
    }
    const gert::Shape *partial = ctx->GetInputShape(INPUT_PARTIAL_BLOCK);
    if (!CheckTensorShape(OP_TYPE, "partial_block", partial, "[T, D]", {UNKNOWN_DIM, UNKNOWN_DIM})) {
        return ge::GRAPH_FAILED;
    }
    const std::vector<int64_t> td = attnres_ge::DimsOf(*partial, 2);
    const int64_t tokens = td[0];
    const int64_t hidden = td[1];
    if (!attnres_ge::CheckDimRange(OP_TYPE, "partial_block", "D", "hidden size", hidden, MIN_HIDDEN, MAX_HIDDEN) ||
        !CheckTensorShape(OP_TYPE, "delta", ctx->GetInputShape(INPUT_DELTA), "[T, D]", {tokens, hidden}) ||
        !CheckTensorShape(OP_TYPE, "numerator", ctx->GetInputShape(INPUT_NUMERATOR), "[T, D]", {tokens, hidden}) ||
        !CheckTensorShape(OP_TYPE, "pseudo_query", ctx->GetInputShape(INPUT_PSEUDO_QUERY), "[D]", {hidden}) ||
        !CheckTensorShape(OP_TYPE, "logit_max", ctx->GetInputShape(INPUT_LOGIT_MAX), "[T]", {tokens}) ||
        !CheckTensorShape(OP_TYPE, "exp_sum", ctx->GetInputShape(INPUT_EXP_SUM), "[T]", {tokens}) ||
        !attnres_ge::CheckPositiveFloatAttr(OP_TYPE, "InferShape", "eps", ReadEps(ctx->GetAttrs()))) {
        return ge::GRAPH_FAILED;
    }
    gert::Shape *partialOut = ctx->GetOutputShape(OUTPUT_PARTIAL_BLOCK);
    gert::Shape *h = ctx->GetOutputShape(OUTPUT_H);
    if (partialOut == nullptr || h == nullptr) {
        OP_LOGE(OP_TYPE, "[InferShape] output %s is missing from the context",
                partialOut == nullptr ? "partial_block" : "h");
        return ge::GRAPH_FAILED;
    }
    attnres_ge::SetShape(partialOut, {tokens, hidden});
    attnres_ge::SetShape(h, {tokens, hidden});
    return ge::GRAPH_SUCCESS;
}

ge::graphStatus InferDataTypeBlockAttnResUpdate(gert::InferDataTypeContext *ctx)
{
    if (ctx == nullptr) {
        OP_LOGE(OP_TYPE, "[InferDataType] infer data type context is null");
        return ge::GRAPH_FAILED;
    }
    struct InputDtype {
        size_t index;
        const char *name;
        ge::DataType dtype;
    };
    // In input order, as the Python prototype checks them.
    const InputDtype inputs[] = {{INPUT_PARTIAL_BLOCK, "partial_block", ge::DT_FLOAT},
                                 {INPUT_DELTA, "delta", ge::DT_BF16},
                                 {INPUT_PSEUDO_QUERY, "pseudo_query", ge::DT_FLOAT},
                                 {INPUT_NUMERATOR, "numerator", ge::DT_FLOAT},
                                 {INPUT_LOGIT_MAX, "logit_max", ge::DT_FLOAT},
                                 {INPUT_EXP_SUM, "exp_sum", ge::DT_FLOAT}};
    for (const InputDtype &input : inputs) {
        if (!attnres_ge::CheckInputDtypeIs(OP_TYPE, ctx, input.index, input.name, input.dtype)) {
            return ge::GRAPH_FAILED;
        }
    }
    ctx->SetOutputDataType(OUTPUT_PARTIAL_BLOCK, ctx->GetInputDataType(INPUT_PARTIAL_BLOCK));
    ctx->SetOutputDataType(OUTPUT_H, ctx->GetInputDataType(INPUT_DELTA));
    return ge::GRAPH_SUCCESS;
}
}  // namespace

IMPL_OP_INFERSHAPE(BlockAttnResUpdate)
    .InferShape(InferShapeBlockAttnResUpdate)
    .InferDataType(InferDataTypeBlockAttnResUpdate);
}  // namespace ops
