/*!
 * \file block_attention_residuals_tiling.cpp
 * \brief BlockAttentionResiduals TilingParse + Tiling.
 *
 * CANN release matched: the kernels of hicann/ops-transformer mhc/block_attention_residuals at commit
 * 6579238f698207417e39d6f09d220d2d62ac5544 (see the header). Those kernels budget UB against a fixed 192 KiB on
 * every SoC (not the platform's UB), so only the vector-core count and the system workspace come from the
 * platform; the UB formulas below count the buffers the kernels allocate.
 */
#include "block_attention_residuals_tiling.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "../../op_proto/cann/block_attention_residuals_io.h"
#include "attnres_platform_resolve.h"
#include "log/log.h"
#include "register/op_impl_registry.h"

namespace optiling {
namespace {
using namespace attnres_ge::block_attention_residuals_io;


constexpr uint64_t UB_BUDGET_BYTES = 192UL * 1024UL;    // the kernels' UB budget (DAV_2201's UB), on every SoC
constexpr uint64_t UB_OVERHEAD_BYTES = 32UL * 1024UL;   // TPipe, queue headers and alignment slack
constexpr uint64_t FP32_BYTES = sizeof(float);
constexpr uint64_t BLOCK_BYTES = 32;                    // one UB block
constexpr uint64_t FP32_PER_BLOCK = BLOCK_BYTES / FP32_BYTES;
constexpr uint64_t HALF_PER_BLOCK = BLOCK_BYTES / 2;    // the H buffers are aligned as 16-bit rows for every dtype
constexpr uint64_t SCALAR_FLOATS = 8;
constexpr uint64_t BLOCK_BROADCAST_FLOATS = 8;          // per-block values broadcast to one UB block each
// Per (aligned) block row in the H-slice kernel: vecMeta, metaSoftmax, metaBrc (8), Kahan sumSq (2), score (2).
constexpr uint64_t HSLICE_FLOATS_PER_BLOCK_ROW = 1 + 1 + BLOCK_BROADCAST_FLOATS + 2 + 2;
constexpr uint64_t HSLICE_BACKWARD_QUEUES = 2;          // inv_norm and probs queues
constexpr uint64_t FP32_WORK_BUFFERS = 3;               // scoreWeight, vRow, outFp32
constexpr uint64_t RESIDENT_FP32_WORK_BUFFERS = 4;      // + the broadcast buffer
constexpr uint64_t RESIDENT_IO_QUEUES = 2;
constexpr uint64_t RELOAD_IN_QUEUES = 2;                // double-buffered input
constexpr uint64_t RELOAD_OUT_QUEUES = 1;

uint64_t AlignUp(uint64_t value, uint64_t alignment)
{
    return (value + alignment - 1) / alignment * alignment;
}

struct ForwardShape {
    int64_t tokens = 0;
    int64_t blocks = 0;
    int64_t hidden = 0;
    int64_t validBlockNum = 0;
    float normEps = DEFAULT_NORM_EPS;
    bool needBackward = false;
    ge::DataType dtype = ge::DT_UNDEFINED;
    uint64_t elemBytes() const { return dtype == ge::DT_FLOAT ? 4 : 2; }
    uint64_t elemsPerBlock() const { return BLOCK_BYTES / elemBytes(); }
    uint64_t blockCount() const { return static_cast<uint64_t>(blocks) + 1; }
};

// ---- UB models of the three kernels (all against UB_BUDGET_BYTES).

// Value rows (N + 1) the resident kernel can keep in UB next to its work buffers.
uint64_t MaxResidentRows(const ForwardShape &s)
{
    const uint64_t h = static_cast<uint64_t>(s.hidden);
    const uint64_t workBytes =
        RESIDENT_FP32_WORK_BUFFERS * h * FP32_BYTES + RESIDENT_IO_QUEUES * h * s.elemBytes() + UB_OVERHEAD_BYTES;
    if (workBytes >= UB_BUDGET_BYTES) {
        return 0;
    }
    return static_cast<uint32_t>((UB_BUDGET_BYTES - workBytes) / (h * s.elemBytes() + FP32_BYTES));
}

uint64_t ReloadUbBytes(const ForwardShape &s)
{
    const uint64_t h = static_cast<uint64_t>(s.hidden);
    const uint64_t rowsAligned = AlignUp(s.blockCount(), FP32_PER_BLOCK);
    uint64_t bytes = (RELOAD_IN_QUEUES + RELOAD_OUT_QUEUES) * AlignUp(h, HALF_PER_BLOCK) * s.elemBytes() +
                     FP32_WORK_BUFFERS * AlignUp(h, FP32_PER_BLOCK) * FP32_BYTES +
                     (2 + BLOCK_BROADCAST_FLOATS) * rowsAligned * FP32_BYTES + SCALAR_FLOATS * FP32_BYTES +
                     UB_OVERHEAD_BYTES;
    if (s.needBackward) {
        bytes += FP32_PER_BLOCK * FP32_BYTES + rowsAligned * FP32_BYTES;  // inv_norm block + probs row
    }
    return bytes;
}

// The largest H chunk of the H-slice kernel that fits, aligned to one UB block of the input dtype.
int64_t HSliceChunk(const ForwardShape &s)
{
    const uint64_t rowsAligned = AlignUp(static_cast<uint32_t>(s.blockCount()), FP32_PER_BLOCK);
    uint64_t fixedBytes = rowsAligned * HSLICE_FLOATS_PER_BLOCK_ROW * FP32_BYTES + SCALAR_FLOATS * FP32_BYTES +
                          UB_OVERHEAD_BYTES;
    if (s.needBackward) {
        fixedBytes += HSLICE_BACKWARD_QUEUES * rowsAligned * FP32_BYTES;
    }
    if (fixedBytes >= UB_BUDGET_BYTES) {
        return s.hidden;  // nothing fits: one chunk of the whole row
    }
    const uint64_t perElem = (RELOAD_IN_QUEUES + RELOAD_OUT_QUEUES) * s.elemBytes() + FP32_WORK_BUFFERS * FP32_BYTES;
    uint64_t chunk = static_cast<uint32_t>((UB_BUDGET_BYTES - fixedBytes) / perElem);
    chunk = std::max(chunk / s.elemsPerBlock() * s.elemsPerBlock(), s.elemsPerBlock());
    return std::min(static_cast<int64_t>(chunk), s.hidden);
}

// ---- input checks (what the kernels need; InferShape has checked the rest)
bool IsFloatDtype(ge::DataType dtype)
{
    return dtype == ge::DT_BF16 || dtype == ge::DT_FLOAT16 || dtype == ge::DT_FLOAT;
}

ge::graphStatus ReadDtypes(gert::TilingContext *ctx, ForwardShape &s)
{
    const std::pair<const gert::CompileTimeTensorDesc *, const char *> tensors[] = {
        {ctx->GetInputDesc(INPUT_PARTIAL_BLOCK), "partial_block"},
        {ctx->GetInputDesc(INPUT_BLOCK_RES), "block_res"},
        {ctx->GetInputDesc(INPUT_PROJ_WEIGHT), "proj_weight"},
        {ctx->GetInputDesc(INPUT_NORM_WEIGHT), "norm_weight"},
        {ctx->GetOutputDesc(OUTPUT_HIDDEN_STATES), "hidden_states"}};
    for (const auto &[desc, name] : tensors) {
        if (desc == nullptr) {
            OP_LOGE(OP_TYPE, "[Tiling] %s is missing from the tiling context", name);
            return ge::GRAPH_FAILED;
        }
        const ge::DataType dtype = desc->GetDataType();
        if (!IsFloatDtype(dtype) || (s.dtype != ge::DT_UNDEFINED && dtype != s.dtype)) {
            OP_LOGE(OP_TYPE, "[Tiling] %s must be float16, bfloat16 or float32 like partial_block (ge::DataType %d), "
                    "got ge::DataType %d", name, static_cast<int>(s.dtype), static_cast<int>(dtype));
            return ge::GRAPH_FAILED;
        }
        s.dtype = dtype;
    }
    return ge::GRAPH_SUCCESS;
}

ge::graphStatus ReadShapes(gert::TilingContext *ctx, ForwardShape &s)
{
    const gert::StorageShape *shapes[] = {ctx->GetInputShape(INPUT_PARTIAL_BLOCK), ctx->GetInputShape(INPUT_BLOCK_RES),
                                          ctx->GetInputShape(INPUT_PROJ_WEIGHT), ctx->GetInputShape(INPUT_NORM_WEIGHT)};
    for (const gert::StorageShape *shape : shapes) {
        if (shape == nullptr) {
            OP_LOGE(OP_TYPE, "[Tiling] an input shape is missing from the tiling context");
            return ge::GRAPH_FAILED;
        }
    }
    const gert::Shape &partial = shapes[INPUT_PARTIAL_BLOCK]->GetOriginShape();
    const gert::Shape &blockRes = shapes[INPUT_BLOCK_RES]->GetOriginShape();
    const gert::Shape &proj = shapes[INPUT_PROJ_WEIGHT]->GetOriginShape();
    const gert::Shape &norm = shapes[INPUT_NORM_WEIGHT]->GetOriginShape();
    if (partial.GetDimNum() != 2 || blockRes.GetDimNum() != 3) {
        OP_LOGE(OP_TYPE, "[Tiling] partial_block must be 2-D [T, H] and block_res 3-D [T, N, H], got ranks %zu and %zu",
                partial.GetDimNum(), blockRes.GetDimNum());
        return ge::GRAPH_FAILED;
    }
    s.tokens = partial.GetDim(0);
    s.hidden = partial.GetDim(1);
    s.blocks = blockRes.GetDim(1);
    if (s.tokens < 0 || s.hidden < 1 || s.blocks < MIN_NUM_BLOCKS || s.blocks > MAX_NUM_BLOCKS) {
        OP_LOGE(OP_TYPE, "[Tiling] need T >= 0, H >= 1 and %ld <= N <= %ld, got T=%ld N=%ld H=%ld", MIN_NUM_BLOCKS,
                MAX_NUM_BLOCKS, s.tokens, s.blocks, s.hidden);
        return ge::GRAPH_FAILED;
    }
    const bool projOk = (proj.GetDimNum() == 1 && proj.GetDim(0) == s.hidden) ||
                        (proj.GetDimNum() == 2 && proj.GetDim(0) == 1 && proj.GetDim(1) == s.hidden);
    if (blockRes.GetDim(0) != s.tokens || blockRes.GetDim(2) != s.hidden || !projOk || norm.GetDimNum() != 1 ||
        norm.GetDim(0) != s.hidden) {
        OP_LOGE(OP_TYPE, "[Tiling] with partial_block [%ld, %ld]: block_res must be [T, N, H], proj_weight [H] or "
                "[1, H], norm_weight [H]; got block_res rank %zu, proj_weight rank %zu, norm_weight rank %zu",
                s.tokens, s.hidden, blockRes.GetDimNum(), proj.GetDimNum(), norm.GetDimNum());
        return ge::GRAPH_FAILED;
    }
    return ge::GRAPH_SUCCESS;
}

ge::graphStatus ReadAttrs(gert::TilingContext *ctx, ForwardShape &s)
{
    const gert::RuntimeAttrs *attrs = ctx->GetAttrs();
    if (attrs == nullptr) {
        OP_LOGE(OP_TYPE, "[Tiling] the tiling context carries no attributes");
        return ge::GRAPH_FAILED;
    }
    const int64_t *valid = attrs->GetAttrPointer<int64_t>(ATTR_VALID_BLOCK_NUM);
    const float *eps = attrs->GetAttrPointer<float>(ATTR_NORM_EPS);
    const bool *needBackward = attrs->GetAttrPointer<bool>(ATTR_NEED_BACKWARD);
    const int64_t given = valid != nullptr ? *valid : VALID_BLOCK_NUM_ALL;
    s.validBlockNum = given == VALID_BLOCK_NUM_ALL ? s.blocks : given;
    if (s.validBlockNum != s.blocks) {
        OP_LOGE(OP_TYPE, "[Tiling] attribute valid_block_num must be -1 or N = %ld, got %ld", s.blocks, given);
        return ge::GRAPH_FAILED;
    }
    s.normEps = eps != nullptr ? *eps : DEFAULT_NORM_EPS;
    if (!(std::isfinite(s.normEps) && s.normEps > 0.0F)) {
        OP_LOGE(OP_TYPE, "[Tiling] attribute norm_eps must be finite and > 0, got %g", static_cast<double>(s.normEps));
        return ge::GRAPH_FAILED;
    }
    s.needBackward = needBackward != nullptr && *needBackward;
    if (s.needBackward) {
        for (const auto &[index, name] : {std::pair<size_t, const char *>{OUTPUT_INV_NORM, "inv_norm"},
                                          std::pair<size_t, const char *>{OUTPUT_PROBS, "probs"}}) {
            const gert::CompileTimeTensorDesc *desc = ctx->GetOutputDesc(index);
            if (desc == nullptr || ctx->GetOutputShape(index) == nullptr || desc->GetDataType() != ge::DT_FLOAT) {
                OP_LOGE(OP_TYPE, "[Tiling] need_backward=true needs output %s as float32, got %s", name,
                        desc == nullptr ? "no output" : "another dtype");
                return ge::GRAPH_FAILED;
            }
        }
    }
    return ge::GRAPH_SUCCESS;
}

BlockAttentionResidualsTilingData MakeTilingData(const ForwardShape &s, uint32_t vectorCoreNum, uint64_t &key)
{
    BlockAttentionResidualsTilingData td;
    std::memset(&td, 0, sizeof(td));  // padding included
    td.numTokens = s.tokens;
    td.numBlocks = s.blocks;
    td.validBlockNum = s.validBlockNum;
    td.hiddenSize = s.hidden;
    td.normEps = s.normEps;
    td.invHiddenSize = 1.0F / static_cast<float>(s.hidden);
    td.blockCount = static_cast<int64_t>(s.blockCount());
    td.needBackward = s.needBackward ? 1U : 0U;
    td.elemsPerToken = s.needBackward ? static_cast<uint32_t>(s.blockCount()) : 0U;
    // One core per token at most; with no tokens the launch keeps every core (the kernels return at once).
    td.usedCoreNum = s.tokens == 0 ? vectorCoreNum
                                   : static_cast<uint32_t>(std::min<int64_t>(s.tokens, vectorCoreNum));
    td.tokensPerCore = s.tokens == 0 ? 0 : (s.tokens + td.usedCoreNum - 1) / td.usedCoreNum;

    if (s.blockCount() <= MaxResidentRows(s)) {
        key = TILING_KEY_RESIDENT;
    } else if (ReloadUbBytes(s) <= UB_BUDGET_BYTES) {
        key = TILING_KEY_RELOAD;
    } else {
        key = TILING_KEY_HSLICE;
        td.hiddenSizeChunk = HSliceChunk(s);
    }
    return td;
}

ge::graphStatus TilingBlockAttentionResiduals(gert::TilingContext *ctx)
{
    if (ctx == nullptr) {
        OP_LOGE(OP_TYPE, "[Tiling] tiling context is null");
        return ge::GRAPH_FAILED;
    }
    ForwardShape shape;
    if (ReadDtypes(ctx, shape) != ge::GRAPH_SUCCESS || ReadShapes(ctx, shape) != ge::GRAPH_SUCCESS ||
        ReadAttrs(ctx, shape) != ge::GRAPH_SUCCESS) {
        return ge::GRAPH_FAILED;
    }
    attnres_ge::ResolvedPlatform platform;
    if (attnres_ge::ResolvePlatform(ctx, OP_TYPE, platform) != ge::GRAPH_SUCCESS) {
        return ge::GRAPH_FAILED;
    }
    uint64_t key = TILING_KEY_RELOAD;
    const BlockAttentionResidualsTilingData td = MakeTilingData(shape, platform.vectorCoreNum, key);
    // The kernels use no workspace of their own.
    if (attnres_ge::WriteTiling(ctx, OP_TYPE, td, platform.sysWorkspaceSize) != ge::GRAPH_SUCCESS) {
        return ge::GRAPH_FAILED;
    }
    ctx->SetTilingKey(key);
    ctx->SetBlockDim(td.usedCoreNum);
    OP_LOGD(OP_TYPE, "[Tiling] key=%lu T=%ld N=%ld H=%ld cores=%u tokensPerCore=%ld chunk=%ld",
            static_cast<unsigned long>(key), shape.tokens, shape.blocks, shape.hidden, td.usedCoreNum,
            td.tokensPerCore, td.hiddenSizeChunk);
    return ge::GRAPH_SUCCESS;
}

ge::graphStatus TilingParseBlockAttentionResiduals(gert::TilingParseContext *ctx)
{
    return attnres_ge::ParseWithoutPlatformReads<BlockAttentionResidualsCompileInfo>(ctx, OP_TYPE);
}

}  // namespace

IMPL_OP_OPTILING(BlockAttentionResiduals)
    .Tiling(TilingBlockAttentionResiduals)
    .TilingParse<BlockAttentionResidualsCompileInfo>(TilingParseBlockAttentionResiduals);

}  // namespace optiling
