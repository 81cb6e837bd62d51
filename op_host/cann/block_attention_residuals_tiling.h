/*!
 * \file block_attention_residuals_tiling.h
 * \brief BlockAttentionResiduals host tiling: compile info, the kernel's tiling record, tiling keys.
 *
 * CANN release matched: the kernels of hicann/ops-transformer mhc/block_attention_residuals at commit
 * 6579238f698207417e39d6f09d220d2d62ac5544
 * (staged in shared/cann-src, see its PROVENANCE.tsv; the kit records commits, not a release number):
 * op_kernel/block_attention_residuals_tiling_data.h (96 bytes, pack(8)) and
 * op_kernel/tiling_key_block_attention_residuals.h (keys 40010 / 40020 / 40030; the dtype is not in the key,
 * each dtype has its own kernel binary). On a warm platform the record (padding zeroed), key, block dim and
 * workspace equal that commit's host tiling; only the cold start differs.
 */
#ifndef ATTNRES_GE_BLOCK_ATTENTION_RESIDUALS_TILING_H
#define ATTNRES_GE_BLOCK_ATTENTION_RESIDUALS_TILING_H

#include <cstddef>
#include <cstdint>

namespace optiling {

// TilingParse stores nothing about the platform: it may run before the platform is filled in.
struct BlockAttentionResidualsCompileInfo {
    uint32_t parsed = 0;  // 1 once TilingParse has seen a platform handle
};

#pragma pack(push, 8)
// The kernel's view of the tiling record (field order, types, packing and size are the kernel's).
struct alignas(8) BlockAttentionResidualsTilingData {
    int64_t numTokens;
    int64_t numBlocks;
    int64_t validBlockNum;
    int64_t hiddenSize;
    int64_t tokensPerCore;
    uint32_t usedCoreNum;
    float normEps;
    float invHiddenSize;
    // 4 bytes of padding here (offset 52): always written as zero.
    uint64_t wsSizePerToken;
    int64_t blockCount;        // N + 1 value rows
    uint32_t needBackward;     // 0 / 1: write inv_norm and probs
    uint32_t stagingBytes;     // no staging buffer: always 0
    uint32_t tokensPerFlush;   // no staging buffer: always 0
    uint32_t elemsPerToken;    // blockCount when need_backward, else 0
    int64_t hiddenSizeChunk;   // H chunk of the H-slice kernel; 0 for the others
};
#pragma pack(pop)
static_assert(sizeof(BlockAttentionResidualsTilingData) == 96, "kernel tiling record is 96 bytes");
static_assert(offsetof(BlockAttentionResidualsTilingData, invHiddenSize) == 48, "kernel layout");
static_assert(offsetof(BlockAttentionResidualsTilingData, wsSizePerToken) == 56, "kernel layout");
static_assert(offsetof(BlockAttentionResidualsTilingData, hiddenSizeChunk) == 88, "kernel layout");

// Kernel variants: all N+1 value rows reloaded from GM per pass; all rows resident in UB; H sliced into chunks.
constexpr uint64_t TILING_KEY_RELOAD = 40010UL;
constexpr uint64_t TILING_KEY_RESIDENT = 40020UL;
constexpr uint64_t TILING_KEY_HSLICE = 40030UL;

}  // namespace optiling

#endif  // ATTNRES_GE_BLOCK_ATTENTION_RESIDUALS_TILING_H
