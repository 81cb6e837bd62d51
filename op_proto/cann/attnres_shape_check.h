/*!
 * \file attnres_shape_check.h
 * \brief Shape and dtype checks shared by both ops' InferShape / InferDataType, with GE's unknown shapes:
 *        a dim < 0 (GE passes -1) is unknown and matches anything; a shape [-2] has unknown rank, so every dim
 *        of it is unknown and its rank is not checked. Each failure logs the op, the tensor, what was expected
 *        and what came, as the Python prototypes (op_proto/block_attention_residuals*.py) word it.
 */
#ifndef ATTNRES_GE_OP_PROTO_SHAPE_CHECK_H
#define ATTNRES_GE_OP_PROTO_SHAPE_CHECK_H

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "exe_graph/runtime/infer_datatype_context.h"
#include "exe_graph/runtime/shape.h"
#include "graph/types.h"
#include "log/log.h"

namespace attnres_ge {

constexpr int64_t UNKNOWN_DIM = -1;
constexpr int64_t UNKNOWN_RANK_DIM = -2;

inline bool IsUnknownDim(int64_t dim)
{
    return dim < 0;
}

inline bool IsUnknownRank(const gert::Shape &shape)
{
    return shape.GetDimNum() == 1 && shape.GetDim(0) == UNKNOWN_RANK_DIM;
}

inline std::string ShapeText(const gert::Shape &shape)
{
    std::string text = "[";
    for (size_t i = 0; i < shape.GetDimNum(); ++i) {
        text += (i == 0 ? "" : ", ") + std::to_string(shape.GetDim(i));
    }
    return text + "]";
}

inline const char *DtypeText(ge::DataType dtype)
{
    switch (dtype) {
        case ge::DT_FLOAT16: return "float16";
        case ge::DT_BF16: return "bfloat16";
        case ge::DT_FLOAT: return "float32";
        case ge::DT_UINT64: return "uint64";
        default: return "an unsupported dtype";
    }
}

inline bool IsFloatDtype(ge::DataType dtype)
{
    return dtype == ge::DT_FLOAT16 || dtype == ge::DT_BF16 || dtype == ge::DT_FLOAT;
}

// The dims of `shape` as the op sees them: `rank` unknown dims when GE does not know the rank.
inline std::vector<int64_t> DimsOf(const gert::Shape &shape, size_t rank)
{
    if (IsUnknownRank(shape)) {
        return std::vector<int64_t>(rank, UNKNOWN_DIM);
    }
    std::vector<int64_t> dims(shape.GetDimNum());
    for (size_t i = 0; i < dims.size(); ++i) {
        dims[i] = shape.GetDim(i);
    }
    return dims;
}

// Checks one tensor against its layout: rank, then each dim whose expected value is known (UNKNOWN_DIM = any).
// `layout` names the dims as docs/contract.md does, e.g. "[T, N, H]".
inline bool CheckTensorShape(const char *op, const char *tensor, const gert::Shape *shape, const char *layout,
                             const std::vector<int64_t> &expected)
{
    if (shape == nullptr) {
        OP_LOGE(op, "[InferShape] input %s is missing", tensor);
        return false;
    }
    if (IsUnknownRank(*shape)) {
        return true;
    }
    std::string wanted = "[";
    for (size_t i = 0; i < expected.size(); ++i) {
        wanted += (i == 0 ? "" : ", ") + (IsUnknownDim(expected[i]) ? std::string("*") : std::to_string(expected[i]));
    }
    wanted += "]";
    if (shape->GetDimNum() != expected.size()) {
        OP_LOGE(op, "[InferShape] %s must be %zu-D %s = %s, got shape %s", tensor, expected.size(), layout,
                wanted.c_str(), ShapeText(*shape).c_str());
        return false;
    }
    for (size_t i = 0; i < expected.size(); ++i) {
        const int64_t dim = shape->GetDim(i);
        if (!IsUnknownDim(dim) && !IsUnknownDim(expected[i]) && dim != expected[i]) {
            OP_LOGE(op, "[InferShape] %s must have shape %s = %s, got %s", tensor, layout, wanted.c_str(),
                    ShapeText(*shape).c_str());
            return false;
        }
    }
    return true;
}

// A known dim must lie in [low, high] (high < 0: no upper bound).
inline bool CheckDimRange(const char *op, const char *tensor, const char *letter, const char *meaning, int64_t value,
                          int64_t low, int64_t high)
{
    if (IsUnknownDim(value) || (value >= low && (high < 0 || value <= high))) {
        return true;
    }
    if (high < 0) {
        OP_LOGE(op, "[InferShape] %s must have %s >= %ld (%s), got %s = %ld", tensor, letter, low, meaning, letter,
                value);
    } else {
        OP_LOGE(op, "[InferShape] %s must have %ld <= %s <= %ld (%s), got %s = %ld", tensor, low, letter, high,
                meaning, letter, value);
    }
    return false;
}

inline void SetShape(gert::Shape *out, const std::vector<int64_t> &dims)
{
    if (out == nullptr) {
        return;
    }
    out->SetDimNum(dims.size());
    for (size_t i = 0; i < dims.size(); ++i) {
        out->SetDim(i, dims[i]);
    }
}

// N + 1 value rows; unknown stays unknown.
inline int64_t RowsOf(int64_t blocks)
{
    return IsUnknownDim(blocks) ? UNKNOWN_DIM : blocks + 1;
}

// The dims both ops' value inputs share; UNKNOWN_DIM where GE does not know them.
struct ValueDims {
    int64_t tokens = UNKNOWN_DIM;
    int64_t blocks = UNKNOWN_DIM;
    int64_t hidden = UNKNOWN_DIM;
};

// partial_block [T, H] with H >= 1, block_res [T, N, H] with minBlocks <= N <= maxBlocks: the checks both ops'
// InferShape start with, in the Python prototypes' order.
inline bool CheckValueShapes(const char *op, const gert::Shape *partial, const gert::Shape *blockRes,
                             int64_t minBlocks, int64_t maxBlocks, ValueDims &dims)
{
    if (!CheckTensorShape(op, "partial_block", partial, "[T, H]", {UNKNOWN_DIM, UNKNOWN_DIM})) {
        return false;
    }
    const std::vector<int64_t> th = DimsOf(*partial, 2);
    dims.tokens = th[0];
    dims.hidden = th[1];
    if (!CheckDimRange(op, "partial_block", "H", "hidden size", dims.hidden, 1, -1) ||
        !CheckTensorShape(op, "block_res", blockRes, "[T, N, H]", {dims.tokens, UNKNOWN_DIM, dims.hidden})) {
        return false;
    }
    dims.blocks = DimsOf(*blockRes, 3)[1];
    return CheckDimRange(op, "block_res", "N", "completed blocks", dims.blocks, minBlocks, maxBlocks);
}

// InferDataType's input checks: partial_block float16, bfloat16 or float32 (its dtype is returned in `dtype`),
// every input of `sameAsPartial` of that dtype, every input of `float32Only` float32.
inline bool CheckInputDtypes(const char *op, gert::InferDataTypeContext *ctx, size_t partialIndex,
                             std::initializer_list<std::pair<size_t, const char *>> sameAsPartial,
                             std::initializer_list<std::pair<size_t, const char *>> float32Only, ge::DataType &dtype)
{
    dtype = ctx->GetInputDataType(partialIndex);
    if (!IsFloatDtype(dtype)) {
        OP_LOGE(op, "[InferDataType] partial_block must have dtype in (float16, bfloat16, float32), got %s (%d)",
                DtypeText(dtype), static_cast<int>(dtype));
        return false;
    }
    for (const auto &[index, name] : sameAsPartial) {
        const ge::DataType got = ctx->GetInputDataType(index);
        if (got != dtype) {
            OP_LOGE(op, "[InferDataType] %s must have the dtype of partial_block (%s), got %s (%d)", name,
                    DtypeText(dtype), DtypeText(got), static_cast<int>(got));
            return false;
        }
    }
    for (const auto &[index, name] : float32Only) {
        const ge::DataType got = ctx->GetInputDataType(index);
        if (got != ge::DT_FLOAT) {
            OP_LOGE(op, "[InferDataType] %s must have dtype float32, got %s (%d)", name, DtypeText(got),
                    static_cast<int>(got));
            return false;
        }
    }
    return true;
}

// InferDataType: input `index` (`tensor`) must have dtype `wanted` (the OpDef's only dtype for it).
inline bool CheckInputDtypeIs(const char *op, gert::InferDataTypeContext *ctx, size_t index, const char *tensor,
                              ge::DataType wanted)
{
    const ge::DataType got = ctx->GetInputDataType(index);
    if (got != wanted) {
        OP_LOGE(op, "[InferDataType] %s must have dtype %s, got %s (%d)", tensor, DtypeText(wanted), DtypeText(got),
                static_cast<int>(got));
        return false;
    }
    return true;
}

// A Float attribute (GE stores float32) that must be finite and > 0; `value` is the stored float32.
inline bool CheckPositiveFloatAttr(const char *op, const char *stage, const char *attr, float value)
{
    if (std::isfinite(value) && value > 0.0F) {
        return true;
    }
    OP_LOGE(op, "[%s] attribute %s must be finite and > 0 (as float32), got %g", stage, attr,
            static_cast<double>(value));
    return false;
}

}  // namespace attnres_ge

#endif  // ATTNRES_GE_OP_PROTO_SHAPE_CHECK_H
