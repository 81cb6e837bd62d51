/*!
 * \file block_attn_res_prepare_io.h
 * \brief BlockAttnResPrepare as its prototype declares it (op_proto/block_attn_res_prepare.py): input, output and
 *        attribute positions, the attribute default and the dim limits. Read by InferShape and Tiling.
 */
#ifndef ATTNRES_GE_BLOCK_ATTN_RES_PREPARE_IO_H
#define ATTNRES_GE_BLOCK_ATTN_RES_PREPARE_IO_H

#include <cstddef>
#include <cstdint>

namespace attnres_ge::block_attn_res_prepare_io {

constexpr const char *OP_TYPE = "BlockAttnResPrepare";
constexpr size_t INPUT_BLOCK_RES = 0;     // [T, N, D] float32
constexpr size_t INPUT_VALID_BLOCKS = 1;  // [1] uint64, read by the kernel
constexpr size_t INPUT_PSEUDO_QUERY = 2;  // [S, D] float32
constexpr size_t INPUT_COUNT = 3;
constexpr size_t OUTPUT_NUMERATOR = 0;    // [S, T, D] float32
constexpr size_t OUTPUT_LOGIT_MAX = 1;    // [S, T] float32
constexpr size_t OUTPUT_EXP_SUM = 2;      // [S, T] float32
constexpr size_t OUTPUT_COUNT = 3;
constexpr size_t ATTR_EPS = 0;
constexpr float DEFAULT_EPS = 1e-6F;
constexpr int64_t MIN_NUM_BLOCKS = 1;
constexpr int64_t MAX_NUM_BLOCKS = 64;
constexpr int64_t MIN_HIDDEN = 1;
constexpr int64_t MAX_HIDDEN = 8192;
constexpr int64_t VALID_BLOCKS_LEN = 1;

}  // namespace attnres_ge::block_attn_res_prepare_io

#endif  // ATTNRES_GE_BLOCK_ATTN_RES_PREPARE_IO_H
