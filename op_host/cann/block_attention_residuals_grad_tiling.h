/*!
 * \file block_attention_residuals_grad_tiling.h
 * \brief BlockAttentionResidualsGrad host tiling: compile info, the kernel's tiling record, tiling keys.
 *
 * CANN release matched: the kernels of hicann/ops-transformer mhc/block_attention_residuals_grad at commit
 * 7e331298a02d2495f44f944761c55044fbd6b466
 * (staged in shared/cann-src, see its PROVENANCE.tsv; the kit records commits, not a release number):
 * op_kernel/block_attention_residuals_grad_tiling_data.h (14 x 8-byte fields, 112 bytes) and
 * op_kernel/block_attention_residuals_grad_tiling_key.h (one template argument hMode: 0 whole H, 1 split H).
 * On a warm platform the tiling record, key, block dim, schedule mode and workspace equal that commit's host
 * tiling; only the cold start differs (platform facts are read in Tiling, never in TilingParse).
 */
#ifndef ATTNRES_GE_BLOCK_ATTENTION_RESIDUALS_GRAD_TILING_H
#define ATTNRES_GE_BLOCK_ATTENTION_RESIDUALS_GRAD_TILING_H

#include <cstddef>
#include <cstdint>

namespace optiling {

// TilingParse stores nothing about the platform: it may run before the platform is filled in.
struct BlockAttentionResidualsGradCompileInfo {
    uint32_t parsed = 0;  // 1 once TilingParse has seen a platform handle
};

// The kernel's view of the tiling record (field order, types and size are the kernel's).
struct BlockAttentionResidualsGradTilingData {
    int64_t batchSize;
    int64_t numBlocks;
    int64_t totalBlocks;  // numBlocks + 1 value rows
    int64_t hiddenSize;
    int64_t hiddenTileSize;
    int64_t hiddenTileNum;
    int64_t coreBatchStart;  // the kernel derives its own batch range from its block index
    int64_t coreBatchEnd;
    int64_t coreBatchCount;
    uint64_t gradScoreWeightWkspOff;
    int64_t coreNum;
    uint64_t perCoreWkspBytes;
    uint64_t gradScoresWkspOff;     // split H only: saved grad_scores [B, N+1]
    uint64_t varianceScaleWkspOff;  // split H only: saved variance_scale [B, N+1]
};
static_assert(sizeof(BlockAttentionResidualsGradTilingData) == 112, "kernel tiling record is 112 bytes");
static_assert(offsetof(BlockAttentionResidualsGradTilingData, varianceScaleWkspOff) == 104, "no padding");

// ASCENDC_TPL key of the kernel's single template argument hMode (values TPL_H_MODE_FULL / TPL_H_MODE_SPLIT).
constexpr uint64_t TILING_KEY_FULL_H = 0UL;
constexpr uint64_t TILING_KEY_SPLIT_H = 1UL;
// The kernel synchronises all launched cores (hard SyncAll), so they must start together: batch schedule mode.
constexpr uint32_t SCHEDULE_MODE_BATCH = 1U;

}  // namespace optiling

#endif  // ATTNRES_GE_BLOCK_ATTENTION_RESIDUALS_GRAD_TILING_H
