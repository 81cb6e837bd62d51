/*!
 * \file block_attention_residuals_grad_tiling.cpp
 * \brief BlockAttentionResidualsGrad TilingParse + Tiling.
 *
 * CANN release matched: the kernels of hicann/ops-transformer mhc/block_attention_residuals_grad at commit
 * 7e331298a02d2495f44f944761c55044fbd6b466 (see the header). The UB formulas below count the buffers those
 * kernels allocate; a kernel whose buffers change needs these counts changed with it.
 */
#include "block_attention_residuals_grad_tiling.h"

#include <algorithm>
#include <cstring>

#include "../../op_proto/cann/block_attention_residuals_grad_io.h"
#include "attnres_platform_resolve.h"
#include "log/log.h"
#include "register/op_impl_registry.h"

namespace optiling {
namespace {
using namespace attnres_ge::block_attention_residuals_grad_io;

constexpr size_t PARTIAL_BLOCK_RANK = 2;
constexpr size_t BLOCK_RES_RANK = 3;

constexpr uint64_t FP32_BYTES = sizeof(float);
constexpr uint64_t ALIGN_32B = 32;
constexpr uint64_t ALIGN_256B = 256;
constexpr uint64_t WORKSPACE_ALIGN = 512;  // per-core and per-row workspace regions, for DMA
// UB the runtime and compiler use beyond the kernel's own buffers.
constexpr uint64_t UB_RESERVE_BYTES = 8UL * 1024UL;

// 910B / 910_93 kernels ("arch22"): H-axis buffers aligned to 32 bytes.
constexpr uint64_t ARCH22_H_FP32_BUFFERS = 6;
constexpr uint64_t ARCH22_H_INPUT_BUFFERS = 1;
constexpr uint64_t ARCH22_FULL_H_BLOCK_BUFFERS = 4;
constexpr uint64_t ARCH22_SPLIT_H_BLOCK_BUFFERS = 6;  // + two Kahan compensation buffers over the blocks
constexpr uint64_t ARCH22_SCALAR_BYTES = 32;
constexpr uint64_t ARCH22_FULL_H_MIN_ELEMS = 64;  // the reduction zeroes a 64-lane tail

// ascend950 regbase kernels ("arch35"): buffers aligned to 256 bytes.
constexpr uint64_t ARCH35_FULL_H_FP32_BUFFERS = 6;
constexpr uint64_t ARCH35_SPLIT_H_FP32_BUFFERS = 7;  // + the workspace output queue
constexpr uint64_t ARCH35_H_INPUT_BUFFERS = 4;
constexpr uint64_t ARCH35_FULL_H_BLOCK_BUFFERS = 4;
constexpr uint64_t ARCH35_SPLIT_H_BLOCK_BUFFERS = 6;
constexpr uint64_t ARCH35_FULL_H_INPUT_ALIGN_ELEMS = 16;
constexpr uint64_t ARCH35_SCALAR_BYTES = 6UL * 8UL * FP32_BYTES;  // 6 slots of 8 floats

uint64_t AlignUp(uint64_t value, uint64_t alignment)
{
    return (value + alignment - 1) / alignment * alignment;
}

uint64_t CeilDiv(uint64_t value, uint64_t divisor)
{
    return (value + divisor - 1) / divisor;
}

struct GradShape {
    int64_t batch = 0;
    int64_t blocks = 0;
    int64_t hidden = 0;
    uint64_t dtypeBytes = 0;
    uint64_t totalBlocks() const { return static_cast<uint64_t>(blocks) + 1; }
};

// ---- UB each kernel variant allocates: whole H, or the fixed part plus one H tile.
uint64_t Arch22FullHBytes(const GradShape &s)
{
    const uint64_t elems = std::max<uint64_t>(static_cast<uint64_t>(s.hidden), ARCH22_FULL_H_MIN_ELEMS);
    return ARCH22_H_FP32_BUFFERS * AlignUp(elems * FP32_BYTES, ALIGN_32B) +
           ARCH22_H_INPUT_BUFFERS * AlignUp(elems * s.dtypeBytes, ALIGN_32B) +
           ARCH22_FULL_H_BLOCK_BUFFERS * AlignUp(s.totalBlocks() * FP32_BYTES, ALIGN_32B) + ARCH22_SCALAR_BYTES;
}

uint64_t Arch22SplitHFixedBytes(const GradShape &s)
{
    return ARCH22_SPLIT_H_BLOCK_BUFFERS * AlignUp(s.totalBlocks() * FP32_BYTES, ALIGN_32B) + ARCH22_SCALAR_BYTES;
}

uint64_t Arch22SplitHBytes(const GradShape &s, uint64_t tile)
{
    return ARCH22_H_FP32_BUFFERS * AlignUp(tile * FP32_BYTES, ALIGN_32B) +
           ARCH22_H_INPUT_BUFFERS * AlignUp(tile * s.dtypeBytes, ALIGN_32B) + Arch22SplitHFixedBytes(s);
}

uint64_t Arch35FullHBytes(const GradShape &s)
{
    const uint64_t h = static_cast<uint64_t>(s.hidden);
    return ARCH35_FULL_H_FP32_BUFFERS * AlignUp(h * FP32_BYTES, ALIGN_256B) +
           ARCH35_H_INPUT_BUFFERS * AlignUp(h, ARCH35_FULL_H_INPUT_ALIGN_ELEMS) * s.dtypeBytes +
           ARCH35_FULL_H_BLOCK_BUFFERS * AlignUp(s.totalBlocks() * FP32_BYTES, ALIGN_256B) + ARCH35_SCALAR_BYTES;
}

uint64_t Arch35SplitHFixedBytes(const GradShape &s)
{
    return ARCH35_SPLIT_H_BLOCK_BUFFERS * AlignUp(s.totalBlocks() * FP32_BYTES, ALIGN_256B) + ARCH35_SCALAR_BYTES;
}

uint64_t Arch35SplitHBytes(const GradShape &s, uint64_t tile)
{
    return ARCH35_SPLIT_H_FP32_BUFFERS * AlignUp(tile * FP32_BYTES, ALIGN_256B) +
           ARCH35_H_INPUT_BUFFERS * AlignUp(tile * s.dtypeBytes, ALIGN_256B) + Arch35SplitHFixedBytes(s);
}

struct SplitHModel {
    uint64_t fixedBytes;    // buffers that do not shrink with the tile
    uint64_t bytesPerElem;  // bytes per H element of the tiled buffers, before alignment
    uint64_t alignElems;    // tile granularity
    uint64_t (*exactBytes)(const GradShape &, uint64_t);
};

SplitHModel SplitModel(const GradShape &s, bool regbase)
{
    if (regbase) {
        // A tile must keep both the fp32 and the input-dtype buffers 256-byte aligned.
        return {Arch35SplitHFixedBytes(s),
                ARCH35_SPLIT_H_FP32_BUFFERS * FP32_BYTES + ARCH35_H_INPUT_BUFFERS * s.dtypeBytes,
                ALIGN_256B / s.dtypeBytes, Arch35SplitHBytes};
    }
    return {Arch22SplitHFixedBytes(s), ARCH22_H_FP32_BUFFERS * FP32_BYTES + ARCH22_H_INPUT_BUFFERS * s.dtypeBytes,
            ALIGN_32B / s.dtypeBytes, Arch22SplitHBytes};
}

// The H tile for the split-H kernel: the largest aligned tile whose exact UB fits, then evened out over the
// fewest tiles so the last tile is not tiny. 0 when not even one aligned tile fits.
int64_t SplitHTileSize(const GradShape &s, uint64_t availableUb, bool regbase)
{
    const SplitHModel model = SplitModel(s, regbase);
    if (availableUb <= model.fixedBytes) {
        return 0;
    }
    uint64_t maxTile = (availableUb - model.fixedBytes) / model.bytesPerElem / model.alignElems * model.alignElems;
    while (maxTile > 0 && model.exactBytes(s, maxTile) > availableUb) {
        maxTile -= model.alignElems;
    }
    if (maxTile == 0) {
        return 0;
    }
    const uint64_t h = static_cast<uint64_t>(s.hidden);
    const uint64_t tileCount = CeilDiv(h, maxTile);
    const uint64_t evenTile = AlignUp(CeilDiv(h, tileCount), model.alignElems);
    return static_cast<int64_t>(std::min(evenTile, maxTile));
}

struct HiddenPlan {
    bool splitH = false;
    int64_t tileSize = 0;
};

HiddenPlan PlanHidden(const GradShape &s, const attnres_ge::ResolvedPlatform &platform)
{
    const uint64_t availableUb = platform.ubSize > UB_RESERVE_BYTES ? platform.ubSize - UB_RESERVE_BYTES : 0;
    const uint64_t wholeHBytes = platform.regbase ? Arch35FullHBytes(s) : Arch22FullHBytes(s);
    HiddenPlan plan;
    plan.splitH = wholeHBytes > availableUb;
    plan.tileSize = plan.splitH ? SplitHTileSize(s, availableUb, platform.regbase) : s.hidden;
    OP_LOGD(OP_TYPE, "[Tiling] %s: %s H=%ld N+1=%lu dtypeBytes=%lu wholeHBytes=%lu availableUb=%lu tile=%ld",
            platform.regbase ? "arch35" : "arch22", plan.splitH ? "SPLIT_H" : "FULL_H", s.hidden,
            static_cast<unsigned long>(s.totalBlocks()), static_cast<unsigned long>(s.dtypeBytes),
            static_cast<unsigned long>(wholeHBytes), static_cast<unsigned long>(availableUb), plan.tileSize);
    return plan;
}

uint64_t DtypeBytes(ge::DataType dtype)
{
    switch (dtype) {
        case ge::DT_FLOAT16:
        case ge::DT_BF16:
            return 2;
        case ge::DT_FLOAT:
            return 4;
        default:
            return 0;
    }
}

// A scalar storage shape is read as [1], as ops-transformer's EnsureNotScalar does.
size_t RankOf(const gert::Shape &shape)
{
    return shape.IsScalar() ? 1 : shape.GetDimNum();
}

ge::graphStatus ReadShape(gert::TilingContext *ctx, GradShape &s)
{
    const gert::StorageShape *partial = ctx->GetInputShape(INPUT_PARTIAL_BLOCK);
    const gert::StorageShape *blockRes = ctx->GetInputShape(INPUT_BLOCK_RES);
    const gert::CompileTimeTensorDesc *partialDesc = ctx->GetInputDesc(INPUT_PARTIAL_BLOCK);
    if (partial == nullptr || blockRes == nullptr || partialDesc == nullptr) {
        OP_LOGE(OP_TYPE, "[Tiling] input partial_block or block_res is missing from the tiling context");
        return ge::GRAPH_FAILED;
    }
    const gert::Shape &ps = partial->GetStorageShape();
    const gert::Shape &bs = blockRes->GetStorageShape();
    if (RankOf(ps) != PARTIAL_BLOCK_RANK || RankOf(bs) != BLOCK_RES_RANK) {
        OP_LOGE(OP_TYPE, "[Tiling] partial_block must be 2-D [T, H] and block_res 3-D [T, N, H], got ranks %zu "
                "and %zu", RankOf(ps), RankOf(bs));
        return ge::GRAPH_FAILED;
    }
    s.batch = ps.GetDim(0);
    s.hidden = ps.GetDim(1);
    s.blocks = bs.GetDim(1);
    if (s.batch <= 0 || s.hidden <= 0 || s.blocks < 0 || s.blocks > MAX_NUM_BLOCKS) {
        OP_LOGE(OP_TYPE, "[Tiling] partial_block/block_res need T >= 1, H >= 1 and 0 <= N <= %ld, got T=%ld N=%ld "
                "H=%ld", MAX_NUM_BLOCKS, s.batch, s.blocks, s.hidden);
        return ge::GRAPH_FAILED;
    }
    if (bs.GetDim(0) != s.batch || bs.GetDim(2) != s.hidden) {
        OP_LOGE(OP_TYPE, "[Tiling] block_res must be [T, N, H] = [%ld, N, %ld] like partial_block, got [%ld, %ld, %ld]",
                s.batch, s.hidden, bs.GetDim(0), bs.GetDim(1), bs.GetDim(2));
        return ge::GRAPH_FAILED;
    }
    s.dtypeBytes = DtypeBytes(partialDesc->GetDataType());
    if (s.dtypeBytes == 0) {
        OP_LOGE(OP_TYPE, "[Tiling] partial_block dtype must be float16, bfloat16 or float32, got ge::DataType %d",
                static_cast<int>(partialDesc->GetDataType()));
        return ge::GRAPH_FAILED;
    }
    return ge::GRAPH_SUCCESS;
}

// Workspace regions past the per-core ones, used by the split-H kernel only.
uint64_t BlockValuesWorkspaceBytes(const GradShape &s)
{
    return AlignUp(static_cast<uint64_t>(s.batch) * s.totalBlocks() * FP32_BYTES, WORKSPACE_ALIGN);
}

BlockAttentionResidualsGradTilingData MakeTilingData(const GradShape &s, const HiddenPlan &plan, uint32_t coreNum)
{
    BlockAttentionResidualsGradTilingData td;
    std::memset(&td, 0, sizeof(td));
    const uint64_t perCoreBytes = AlignUp(static_cast<uint64_t>(s.hidden) * FP32_BYTES, WORKSPACE_ALIGN);
    td.batchSize = s.batch;
    td.numBlocks = s.blocks;
    td.totalBlocks = static_cast<int64_t>(s.totalBlocks());
    td.hiddenSize = s.hidden;
    td.hiddenTileSize = plan.tileSize;
    td.hiddenTileNum = static_cast<int64_t>(CeilDiv(static_cast<uint64_t>(s.hidden), plan.tileSize));
    td.coreBatchStart = 0;
    td.coreBatchEnd = s.batch;
    td.coreBatchCount = 0;
    td.gradScoreWeightWkspOff = 0;
    td.coreNum = coreNum;
    td.perCoreWkspBytes = perCoreBytes;
    if (plan.splitH) {
        td.gradScoresWkspOff = perCoreBytes * coreNum;
        td.varianceScaleWkspOff = td.gradScoresWkspOff + BlockValuesWorkspaceBytes(s);
    }
    return td;
}

ge::graphStatus TilingBlockAttentionResidualsGrad(gert::TilingContext *ctx)
{
    if (ctx == nullptr) {
        OP_LOGE(OP_TYPE, "[Tiling] tiling context is null");
        return ge::GRAPH_FAILED;
    }
    GradShape shape;
    if (ReadShape(ctx, shape) != ge::GRAPH_SUCCESS) {
        return ge::GRAPH_FAILED;
    }
    attnres_ge::ResolvedPlatform platform;
    if (attnres_ge::ResolvePlatform(ctx, OP_TYPE, platform) != ge::GRAPH_SUCCESS) {
        return ge::GRAPH_FAILED;
    }
    const HiddenPlan plan = PlanHidden(shape, platform);
    if (plan.tileSize <= 0) {
        OP_LOGE(OP_TYPE, "[Tiling] no H tile fits in UB: H=%ld N=%ld dtype bytes=%lu UB bytes=%lu", shape.hidden,
                shape.blocks, static_cast<unsigned long>(shape.dtypeBytes),
                static_cast<unsigned long>(platform.ubSize));
        return ge::GRAPH_FAILED;
    }

    const BlockAttentionResidualsGradTilingData td = MakeTilingData(shape, plan, platform.vectorCoreNum);
    uint64_t userWorkspace = td.perCoreWkspBytes * platform.vectorCoreNum;
    if (plan.splitH) {
        userWorkspace += 2 * BlockValuesWorkspaceBytes(shape);  // grad_scores and variance_scale
    }
    if (attnres_ge::WriteTiling(ctx, OP_TYPE, td, userWorkspace + platform.sysWorkspaceSize) != ge::GRAPH_SUCCESS) {
        return ge::GRAPH_FAILED;
    }
    ctx->SetTilingKey(plan.splitH ? TILING_KEY_SPLIT_H : TILING_KEY_FULL_H);
    ctx->SetBlockDim(platform.vectorCoreNum);
    ctx->SetScheduleMode(SCHEDULE_MODE_BATCH);
    return ge::GRAPH_SUCCESS;
}

ge::graphStatus TilingParseBlockAttentionResidualsGrad(gert::TilingParseContext *ctx)
{
    return attnres_ge::ParseWithoutPlatformReads<BlockAttentionResidualsGradCompileInfo>(ctx, OP_TYPE);
}

}  // namespace

IMPL_OP_OPTILING(BlockAttentionResidualsGrad)
    .Tiling(TilingBlockAttentionResidualsGrad)
    .TilingParse<BlockAttentionResidualsGradCompileInfo>(TilingParseBlockAttentionResidualsGrad);

}  // namespace optiling
