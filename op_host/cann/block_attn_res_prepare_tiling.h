/*!
 * \file block_attn_res_prepare_tiling.h
 * \brief BlockAttnResPrepare host tiling: compile info, the two kernel templates' tiling records, tiling keys.
 *
 * CANN kernels matched: hicann/ops-transformer attention/block_attn_res_prepare as staged in
 * shared/cann-src/upstream/two-phase (recursion-ascend/ops-transformer@a093e95, see its PROVENANCE.tsv):
 * op_kernel/arch35/block_attn_res_prepare_tiling_data.h (vector record 48 bytes, mix record 136 bytes) and
 * block_attn_res_prepare_apt_tiling_key.h (key 0 vector-only, AIV; key 1 mix, one AIC with two AIVs). On a filled
 * Ascend 950 platform the record (padding zeroed), key, block dim and workspace equal that host code's; only the
 * cold start differs: CANN's TilingParse reads the core counts and memory sizes and fails while the platform is
 * empty, ours reads nothing there.
 */
#ifndef ATTNRES_GE_BLOCK_ATTN_RES_PREPARE_TILING_H
#define ATTNRES_GE_BLOCK_ATTN_RES_PREPARE_TILING_H

#include <cstddef>
#include <cstdint>

namespace optiling {

// TilingParse stores nothing about the platform: it may run before the platform is filled in.
struct BlockAttnResPrepareCompileInfo {
    uint32_t parsed = 0;  // 1 once TilingParse has seen a platform handle
};

constexpr uint64_t PREPARE_TILING_KEY_VECTOR = 0UL;  // AIV only: one (token, query) pair per work unit
constexpr uint64_t PREPARE_TILING_KEY_MIX = 1UL;     // AIC matmuls + AIV softmax, (token group, query tile) units

// The vector kernel's record. Fields wide to narrow, natural alignment, 3 trailing padding bytes (written as 0).
struct BlockAttnResPrepareVectorTilingData {
    uint32_t totalT;
    uint32_t totalS;
    uint32_t totalWorkUnits;   // T * S
    uint32_t totalD;
    uint32_t blockFactor;      // work units of every core
    uint32_t tailBlockFactor;  // blockFactor + 1 when the units do not divide evenly (the first bigCoreNum cores)
    uint32_t baseD;            // D tile
    uint32_t statUbElems;      // UB floats of the softmax statistics
    float eps;
    uint16_t usedCoreNum;
    uint16_t bigCoreNum;
    uint8_t totalN;
    uint8_t vCacheRows;        // snapshot rows kept in UB across queries
    uint8_t qBufferNum;
    uint8_t vBufferNum;
    uint8_t oBufferNum;
};
static_assert(sizeof(BlockAttnResPrepareVectorTilingData) == 48, "vector kernel tiling record is 48 bytes");
static_assert(offsetof(BlockAttnResPrepareVectorTilingData, eps) == 32, "kernel layout");
static_assert(offsetof(BlockAttnResPrepareVectorTilingData, usedCoreNum) == 36, "kernel layout");
static_assert(offsetof(BlockAttnResPrepareVectorTilingData, totalN) == 40, "kernel layout");
static_assert(offsetof(BlockAttnResPrepareVectorTilingData, oBufferNum) == 44, "kernel layout");

// The mix kernel's record. 2 trailing padding bytes (written as 0).
struct BlockAttnResPrepareMixTilingData {
    // Buffer sizes in floats.
    uint64_t qL1Elems;
    uint64_t vL1Elems;
    uint64_t eL1Elems;
    uint64_t vUbElems;
    uint64_t dotUbElems;
    uint64_t reduceUbElems;
    uint64_t softmaxUbElems;
    uint64_t workspacePerCoreElems;
    uint32_t totalT;
    uint32_t totalS;
    uint32_t totalWorkUnits;  // T groups * S tiles
    uint32_t totalD;
    uint32_t baseT;           // tokens per group (packed into one matmul's N)
    uint32_t baseS;           // queries per tile
    uint32_t baseD;
    uint32_t baseDAlign;
    uint32_t sTileNum;
    uint32_t dTileNum;
    uint32_t sAlign;
    uint32_t nAlign;
    uint32_t mm1NAlign;
    uint32_t dAlign;
    float eps;
    uint16_t usedCoreNum;
    uint16_t aicCoreNum;
    uint16_t aivCoreNum;
    uint8_t totalN;
    uint8_t qL1BufferNum;
    uint8_t vL1BufferNum;
    uint8_t vUbBufferNum;
};
static_assert(sizeof(BlockAttnResPrepareMixTilingData) == 136, "mix kernel tiling record is 136 bytes");
static_assert(offsetof(BlockAttnResPrepareMixTilingData, totalT) == 64, "kernel layout");
static_assert(offsetof(BlockAttnResPrepareMixTilingData, eps) == 120, "kernel layout");
static_assert(offsetof(BlockAttnResPrepareMixTilingData, usedCoreNum) == 124, "kernel layout");
static_assert(offsetof(BlockAttnResPrepareMixTilingData, totalN) == 130, "kernel layout");

}  // namespace optiling

#endif  // ATTNRES_GE_BLOCK_ATTN_RES_PREPARE_TILING_H
