/*!
 * \file block_attn_res_update_io.h
 * \brief BlockAttnResUpdate as its prototype declares it (op_proto/block_attn_res_update.py): input, output and
 *        attribute positions, the attribute default and the limits of D. partial_block is both input 0 and
 *        output 0 (a reference tensor: the output is the input's memory, updated in place).
 */
#ifndef ATTNRES_GE_BLOCK_ATTN_RES_UPDATE_IO_H
#define ATTNRES_GE_BLOCK_ATTN_RES_UPDATE_IO_H

#include <cstddef>
#include <cstdint>

namespace attnres_ge::block_attn_res_update_io {

constexpr const char *OP_TYPE = "BlockAttnResUpdate";
constexpr size_t INPUT_PARTIAL_BLOCK = 0;  // [T, D] float32
constexpr size_t INPUT_DELTA = 1;          // [T, D] bfloat16
constexpr size_t INPUT_PSEUDO_QUERY = 2;   // [D] float32
constexpr size_t INPUT_NUMERATOR = 3;      // [T, D] float32
constexpr size_t INPUT_LOGIT_MAX = 4;      // [T] float32
constexpr size_t INPUT_EXP_SUM = 5;        // [T] float32
constexpr size_t INPUT_COUNT = 6;
constexpr size_t OUTPUT_PARTIAL_BLOCK = 0;  // [T, D] float32, the reference output
constexpr size_t OUTPUT_H = 1;              // [T, D] in delta's dtype
constexpr size_t OUTPUT_COUNT = 2;
constexpr size_t ATTR_EPS = 0;
constexpr float DEFAULT_EPS = 1e-6F;
constexpr int64_t MIN_HIDDEN = 0;
constexpr int64_t MAX_HIDDEN = 8192;

}  // namespace attnres_ge::block_attn_res_update_io

#endif  // ATTNRES_GE_BLOCK_ATTN_RES_UPDATE_IO_H
