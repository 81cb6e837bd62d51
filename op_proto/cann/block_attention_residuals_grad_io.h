/*!
 * \file block_attention_residuals_grad_io.h
 * \brief BlockAttentionResidualsGrad as its prototype declares it (op_proto/block_attention_residuals_grad.py):
 *        input and output positions and the range of N. Read by InferShape and Tiling.
 */
#ifndef ATTNRES_GE_BLOCK_ATTENTION_RESIDUALS_GRAD_IO_H
#define ATTNRES_GE_BLOCK_ATTENTION_RESIDUALS_GRAD_IO_H

#include <cstddef>
#include <cstdint>

namespace attnres_ge::block_attention_residuals_grad_io {

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

}  // namespace attnres_ge::block_attention_residuals_grad_io

#endif  // ATTNRES_GE_BLOCK_ATTENTION_RESIDUALS_GRAD_IO_H
