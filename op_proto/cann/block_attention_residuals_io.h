/*!
 * \file block_attention_residuals_io.h
 * \brief BlockAttentionResiduals as its prototype declares it (op_proto/block_attention_residuals.py): input,
 *        output and attribute positions, attribute defaults and the range of N. Read by InferShape and Tiling.
 */
#ifndef ATTNRES_GE_BLOCK_ATTENTION_RESIDUALS_IO_H
#define ATTNRES_GE_BLOCK_ATTENTION_RESIDUALS_IO_H

#include <cstddef>
#include <cstdint>

namespace attnres_ge::block_attention_residuals_io {

constexpr const char *OP_TYPE = "BlockAttentionResiduals";
constexpr size_t INPUT_PARTIAL_BLOCK = 0;
constexpr size_t INPUT_BLOCK_RES = 1;
constexpr size_t INPUT_PROJ_WEIGHT = 2;
constexpr size_t INPUT_NORM_WEIGHT = 3;
constexpr size_t OUTPUT_HIDDEN_STATES = 0;
constexpr size_t OUTPUT_INV_NORM = 1;
constexpr size_t OUTPUT_PROBS = 2;
constexpr size_t ATTR_VALID_BLOCK_NUM = 0;
constexpr size_t ATTR_NORM_EPS = 1;
constexpr size_t ATTR_NEED_BACKWARD = 2;
constexpr int64_t MIN_NUM_BLOCKS = 1;
constexpr int64_t MAX_NUM_BLOCKS = 100;
constexpr int64_t VALID_BLOCK_NUM_ALL = -1;
constexpr float DEFAULT_NORM_EPS = 1e-6F;

}  // namespace attnres_ge::block_attention_residuals_io

#endif  // ATTNRES_GE_BLOCK_ATTENTION_RESIDUALS_IO_H
