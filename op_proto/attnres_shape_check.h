/*!
 * \file attnres_shape_check.h
 * \brief Shape and dtype checks shared by both ops' InferShape / InferDataType, with GE's unknown shapes:
 *        a dim < 0 (GE passes -1) is unknown and matches anything; a shape [-2] has unknown rank, so every dim
 *        of it is unknown and its rank is not checked. Each failure logs the op, the tensor, what was expected
 *        and what came, as the Python prototypes (op_proto/block_attention_residuals*.py) word it.
 */
#ifndef ATTNRES_GE_OP_PROTO_SHAPE_CHECK_H
#define ATTNRES_GE_OP_PROTO_SHAPE_CHECK_H

#include <cstdint>
#include <string>
#include <vector>

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
// `layout` names the dims as SPEC.md does, e.g. "[T, N, H]".
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

}  // namespace attnres_ge

#endif  // ATTNRES_GE_OP_PROTO_SHAPE_CHECK_H
