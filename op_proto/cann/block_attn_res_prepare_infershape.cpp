/*!
 * \file block_attn_res_prepare_infershape.cpp
 * \brief InferShape / InferDataType of BlockAttnResPrepare. Accepts and rejects what the Python prototype
 *        (op_proto/block_attn_res_prepare.py) does, including GE's unknown dims (-1) and unknown rank ([-2]):
 *        numerator [S, T, D], logit_max and exp_sum [S, T], all float32. On every shape CANN's host code accepts
 *        the outputs equal its InferShape's; beyond CANN it checks the limits (1 <= N <= 64, 1 <= D <= 8192) and eps.
 */
#include "attnres_shape_check.h"
#include "block_attn_res_prepare_io.h"
#include "register/op_impl_registry.h"

namespace ops {
namespace {
using attnres_ge::CheckDimRange;
using attnres_ge::CheckTensorShape;
using attnres_ge::UNKNOWN_DIM;
using namespace attnres_ge::block_attn_res_prepare_io;

float ReadEps(const gert::RuntimeAttrs *attrs)
{
    const float *eps = attrs == nullptr ? nullptr : attrs->GetAttrPointer<float>(ATTR_EPS);
    return eps == nullptr ? DEFAULT_EPS : *eps;
}

ge::graphStatus InferShapeBlockAttnResPrepare(gert::InferShapeContext *ctx)
{
    if (ctx == nullptr) {
        OP_LOGE(OP_TYPE, "[InferShape] infer shape context is null");
        return ge::GRAPH_FAILED;
    }
    const gert::Shape *blockRes = ctx->GetInputShape(INPUT_BLOCK_RES);
    if (!CheckTensorShape(OP_TYPE, "block_res", blockRes, "[T, N, D]", {UNKNOWN_DIM, UNKNOWN_DIM, UNKNOWN_DIM})) {
        return ge::GRAPH_FAILED;
    }
    const std::vector<int64_t> tnd = attnres_ge::DimsOf(*blockRes, 3);
    const int64_t tokens = tnd[0];
    const int64_t hidden = tnd[2];
    if (!CheckDimRange(OP_TYPE, "block_res", "N", "sealed snapshots", tnd[1], MIN_NUM_BLOCKS, MAX_NUM_BLOCKS) ||
        !CheckDimRange(OP_TYPE, "block_res", "D", "hidden size", hidden, MIN_HIDDEN, MAX_HIDDEN) ||
        !CheckTensorShape(OP_TYPE, "valid_blocks", ctx->GetInputShape(INPUT_VALID_BLOCKS), "[1]",
                          {VALID_BLOCKS_LEN})) {
        return ge::GRAPH_FAILED;
    }
    const gert::Shape *pseudoQuery = ctx->GetInputShape(INPUT_PSEUDO_QUERY);
    if (!CheckTensorShape(OP_TYPE, "pseudo_query", pseudoQuery, "[S, D]", {UNKNOWN_DIM, hidden}) ||
        !attnres_ge::CheckPositiveFloatAttr(OP_TYPE, "InferShape", "eps", ReadEps(ctx->GetAttrs()))) {
        return ge::GRAPH_FAILED;
    }
    const int64_t queries = attnres_ge::DimsOf(*pseudoQuery, 2)[0];
    gert::Shape *numerator = ctx->GetOutputShape(OUTPUT_NUMERATOR);
    gert::Shape *logitMax = ctx->GetOutputShape(OUTPUT_LOGIT_MAX);
    gert::Shape *expSum = ctx->GetOutputShape(OUTPUT_EXP_SUM);
    if (numerator == nullptr || logitMax == nullptr || expSum == nullptr) {
        OP_LOGE(OP_TYPE, "[InferShape] output %s is missing from the context",
                numerator == nullptr ? "numerator" : (logitMax == nullptr ? "logit_max" : "exp_sum"));
        return ge::GRAPH_FAILED;
    }
    attnres_ge::SetShape(numerator, {queries, tokens, hidden});
    attnres_ge::SetShape(logitMax, {queries, tokens});
    attnres_ge::SetShape(expSum, {queries, tokens});
    return ge::GRAPH_SUCCESS;
}

ge::graphStatus InferDataTypeBlockAttnResPrepare(gert::InferDataTypeContext *ctx)
{
    if (ctx == nullptr) {
        OP_LOGE(OP_TYPE, "[InferDataType] infer data type context is null");
        return ge::GRAPH_FAILED;
    }
    if (!attnres_ge::CheckInputDtypeIs(OP_TYPE, ctx, INPUT_BLOCK_RES, "block_res", ge::DT_FLOAT) ||
        !attnres_ge::CheckInputDtypeIs(OP_TYPE, ctx, INPUT_VALID_BLOCKS, "valid_blocks", ge::DT_UINT64) ||
        !attnres_ge::CheckInputDtypeIs(OP_TYPE, ctx, INPUT_PSEUDO_QUERY, "pseudo_query", ge::DT_FLOAT)) {
        return ge::GRAPH_FAILED;
    }
    for (size_t output : {OUTPUT_NUMERATOR, OUTPUT_LOGIT_MAX, OUTPUT_EXP_SUM}) {
        ctx->SetOutputDataType(output, ge::DT_FLOAT);
    }
    return ge::GRAPH_SUCCESS;
}
}  // namespace

IMPL_OP_INFERSHAPE(BlockAttnResPrepare)
    .InferShape(InferShapeBlockAttnResPrepare)
    .InferDataType(InferDataTypeBlockAttnResPrepare);
}  // namespace ops
