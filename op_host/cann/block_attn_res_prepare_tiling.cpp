/*!
 * \file block_attn_res_prepare_tiling.cpp
 * \brief BlockAttnResPrepare TilingParse + Tiling (overriding CANN's three registrations together).
 *
 * CANN kernels matched: attention/block_attn_res_prepare (see the header). Two kernel templates:
 *   - mix (key 1): tried first. Runs on (AIC, 2 AIV) groups and needs T >= 32, S >= 16, D >= 256, T * D within
 *     uint32 (its strided output row) and a (query tile, token group, D tile) whose L1, L0A/B/C and UB buffers fit;
 *   - vector (key 0): every other shape; AIV only, one (token, query) pair per work unit.
 * The buffer formulas below count the buffers each kernel allocates (floats), as its tiling record describes them.
 *
 * Platform facts are read in Tiling only (attnres_platform_resolve): vector cores, UB and the system workspace
 * through ResolvePlatform (re-query, fallback to 1 core / the smallest UB, strict mode), and the mix template's
 * cube facts (AIC cores, L1, L0A/B/C) through PlatformAscendC. A platform that needed the fallback tiles the
 * vector template on one core: always correct, only slower.
 */
#include "block_attn_res_prepare_tiling.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "../../op_proto/cann/attnres_shape_check.h"
#include "../../op_proto/cann/block_attn_res_prepare_io.h"
#include "attnres_platform_resolve.h"
#include "log/log.h"
#include "register/op_impl_registry.h"
#include "tiling/platform/platform_ascendc.h"

namespace optiling {
namespace {
using namespace attnres_ge::block_attn_res_prepare_io;

constexpr int32_t NPU_ARCH_ASCEND950 = 3510;  // the only arch CANN ships this op's kernels for
constexpr size_t BLOCK_RES_RANK = 3;           // [T, N, D]
constexpr size_t PSEUDO_QUERY_RANK = 2;        // [S, D]
constexpr size_t VALID_BLOCKS_RANK = 1;        // [1]
constexpr uint64_t FP32_BYTES = sizeof(float);
constexpr uint64_t UINT32_LIMIT = std::numeric_limits<uint32_t>::max();
constexpr uint64_t UINT16_LIMIT = std::numeric_limits<uint16_t>::max();
constexpr uint64_t UB_RESERVED_BYTES = 8UL * 1024UL;  // both kernels keep 8 KiB of UB for themselves
constexpr uint64_t L1_RESERVED_BYTES = 8UL * 1024UL;  // and the mix kernel 8 KiB of L1
constexpr uint64_t DOUBLE_BUFFER = 2;
constexpr uint64_t SINGLE_BUFFER = 1;
constexpr uint64_t FP32_VECTOR_REG = 64;  // floats in one vector register

// ---- vector kernel
constexpr uint64_t VECTOR_ROW_ALIGN = FP32_VECTOR_REG;  // every UB row starts on a register
constexpr uint64_t VECTOR_SCALAR_BLOCK = 8;
constexpr uint64_t VECTOR_STAT_VECTORS = 2;             // running max and running sum
constexpr uint64_t VECTOR_STAT_BUFFERS = 2;
constexpr uint64_t VECTOR_STAT_UB_ELEMS = VECTOR_STAT_VECTORS * (FP32_VECTOR_REG + VECTOR_SCALAR_BLOCK);
constexpr uint64_t VECTOR_BASE_D_STEPS[] = {1024, 512, 256};  // after the whole D

// ---- mix kernel
constexpr uint64_t AIV_PER_AIC = 2;
constexpr uint64_t CUBE_BLOCK = 16;  // cube fractal edge: the alignment of every matmul dim
constexpr uint64_t MIX_MIN_T = 32;
constexpr uint64_t MIX_MIN_S = 16;
constexpr uint64_t MIX_MIN_D = 256;
constexpr uint64_t MIX_BASE_S_STEPS[] = {128, 64, 32, 16};  // after the whole S
constexpr uint64_t MIX_BASE_T_STEPS[] = {8, 4, 2, 1};
constexpr uint64_t MIX_BASE_D_STEPS[] = {512, 256, 128};
constexpr uint64_t MIX_MM1_MAX_BASE_K = 64;    // K step of the score matmul
constexpr uint64_t MIX_L1_SLOTS = 4;           // one matmul's operands may take a quarter of L1
constexpr uint64_t MIX_MAX_RUNTIME_GROUPS = 16;  // softmax slots per core: the kernel may regroup tokens at run time
constexpr uint64_t MIX_STAT_VECTORS = 2;

uint64_t CeilDiv(uint64_t value, uint64_t factor)
{
    return (value + factor - 1) / factor;
}

uint64_t AlignUp(uint64_t value, uint64_t factor)
{
    return CeilDiv(value, factor) * factor;
}

struct PrepareShape {
    uint64_t tokens = 0;   // T
    uint64_t blocks = 0;   // N
    uint64_t queries = 0;  // S
    uint64_t hidden = 0;   // D
    float eps = DEFAULT_EPS;
};

struct PrepareCores {
    uint64_t aiv = 0;
    uint64_t aic = 0;       // 0: mix template unavailable (no cube facts)
    uint64_t ub = 0;
    uint64_t l1 = 0;
    uint64_t l0a = 0;
    uint64_t l0b = 0;
    uint64_t l0c = 0;
    uint64_t sysWorkspace = 0;
};

// ---- inputs (Tiling sees concrete shapes; InferShape has checked the layout with unknown dims)

ge::graphStatus ReadDtypes(gert::TilingContext *ctx)
{
    const struct {
        size_t index;
        const char *name;
        ge::DataType dtype;
    } inputs[] = {{INPUT_BLOCK_RES, "block_res", ge::DT_FLOAT},
                  {INPUT_VALID_BLOCKS, "valid_blocks", ge::DT_UINT64},
                  {INPUT_PSEUDO_QUERY, "pseudo_query", ge::DT_FLOAT}};
    for (const auto &input : inputs) {
        const gert::CompileTimeTensorDesc *desc = ctx->GetInputDesc(input.index);
        if (desc == nullptr || desc->GetDataType() != input.dtype) {
            OP_LOGE(OP_TYPE, "[Tiling] input %s must have ge::DataType %d, got %d", input.name,
                    static_cast<int>(input.dtype), desc == nullptr ? -1 : static_cast<int>(desc->GetDataType()));
            return ge::GRAPH_FAILED;
        }
    }
    return ge::GRAPH_SUCCESS;
}

ge::graphStatus ReadShapes(gert::TilingContext *ctx, PrepareShape &s)
{
    const gert::StorageShape *blockResShape = ctx->GetInputShape(INPUT_BLOCK_RES);
    const gert::StorageShape *validShape = ctx->GetInputShape(INPUT_VALID_BLOCKS);
    const gert::StorageShape *queryShape = ctx->GetInputShape(INPUT_PSEUDO_QUERY);
    if (blockResShape == nullptr || validShape == nullptr || queryShape == nullptr) {
        OP_LOGE(OP_TYPE, "[Tiling] input %s has no shape in the tiling context",
                blockResShape == nullptr ? "block_res" : (validShape == nullptr ? "valid_blocks" : "pseudo_query"));
        return ge::GRAPH_FAILED;
    }
    const gert::Shape &blockRes = blockResShape->GetOriginShape();
    const gert::Shape &valid = validShape->GetOriginShape();
    const gert::Shape &query = queryShape->GetOriginShape();
    if (blockRes.GetDimNum() != BLOCK_RES_RANK || query.GetDimNum() != PSEUDO_QUERY_RANK ||
        valid.GetDimNum() != VALID_BLOCKS_RANK ||
        valid.GetDim(0) != VALID_BLOCKS_LEN) {
        OP_LOGE(OP_TYPE, "[Tiling] need block_res [T, N, D], valid_blocks [1], pseudo_query [S, D]; got ranks %zu, "
                "%zu (first dim %ld), %zu", blockRes.GetDimNum(), valid.GetDimNum(),
                valid.GetDimNum() > 0 ? valid.GetDim(0) : -1L, query.GetDimNum());
        return ge::GRAPH_FAILED;
    }
    const int64_t t = blockRes.GetDim(0), n = blockRes.GetDim(1), d = blockRes.GetDim(2);
    const int64_t sq = query.GetDim(0), dq = query.GetDim(1);
    // CANN's kernels have no empty-launch path, so T = 0 or S = 0 is rejected here as CANN's host code does.
    if (t < 1 || sq < 1 || n < MIN_NUM_BLOCKS || n > MAX_NUM_BLOCKS || d < MIN_HIDDEN || d > MAX_HIDDEN || dq != d ||
        static_cast<uint64_t>(t) > UINT32_LIMIT || static_cast<uint64_t>(sq) > UINT32_LIMIT) {
        OP_LOGE(OP_TYPE, "[Tiling] CANN's kernel needs T >= 1, S >= 1 (each < 2^32), %ld <= N <= %ld, %ld <= D <= "
                "%ld and pseudo_query's D equal to block_res's; got T=%ld N=%ld D=%ld, pseudo_query [%ld, %ld]",
                MIN_NUM_BLOCKS, MAX_NUM_BLOCKS, MIN_HIDDEN, MAX_HIDDEN, t, n, d, sq, dq);
        return ge::GRAPH_FAILED;
    }
    s.tokens = static_cast<uint64_t>(t);
    s.blocks = static_cast<uint64_t>(n);
    s.hidden = static_cast<uint64_t>(d);
    s.queries = static_cast<uint64_t>(sq);
    return ge::GRAPH_SUCCESS;
}

ge::graphStatus ReadAttrs(gert::TilingContext *ctx, PrepareShape &s)
{
    const gert::RuntimeAttrs *attrs = ctx->GetAttrs();
    if (attrs == nullptr) {
        OP_LOGE(OP_TYPE, "[Tiling] the tiling context carries no attributes");
        return ge::GRAPH_FAILED;
    }
    const float *eps = attrs->GetAttrPointer<float>(ATTR_EPS);
    s.eps = eps != nullptr ? *eps : DEFAULT_EPS;
    return attnres_ge::CheckPositiveFloatAttr(OP_TYPE, "Tiling", "eps", s.eps) ? ge::GRAPH_SUCCESS : ge::GRAPH_FAILED;
}

// ---- platform

ge::graphStatus ReadCores(gert::TilingContext *ctx, PrepareCores &cores)
{
    attnres_ge::ResolvedPlatform platform;
    if (attnres_ge::ResolvePlatform(ctx, OP_TYPE, platform) != ge::GRAPH_SUCCESS) {
        return ge::GRAPH_FAILED;
    }
    if (platform.npuArch != 0 && platform.npuArch != NPU_ARCH_ASCEND950) {
        OP_LOGE(OP_TYPE, "[Tiling] CANN ships this op's kernels for ascend950 (NpuArch %d) only, the platform has "
                "NpuArch %d", NPU_ARCH_ASCEND950, platform.npuArch);
        return ge::GRAPH_FAILED;
    }
    cores = PrepareCores{};
    cores.aiv = platform.vectorCoreNum;
    cores.ub = platform.ubSize;
    cores.sysWorkspace = platform.sysWorkspaceSize;
    if (!platform.fellBack) {  // a complete platform: the mix template may use its cube units
        const platform_ascendc::PlatformAscendC ascendc(ctx->GetPlatformInfo());
        cores.aic = ascendc.GetCoreNumAic();
        ascendc.GetCoreMemSize(platform_ascendc::CoreMemType::L1, cores.l1);
        ascendc.GetCoreMemSize(platform_ascendc::CoreMemType::L0_A, cores.l0a);
        ascendc.GetCoreMemSize(platform_ascendc::CoreMemType::L0_B, cores.l0b);
        ascendc.GetCoreMemSize(platform_ascendc::CoreMemType::L0_C, cores.l0c);
    }
    if (cores.aiv > UINT16_LIMIT || cores.aic > UINT16_LIMIT || cores.ub <= UB_RESERVED_BYTES) {
        OP_LOGE(OP_TYPE, "[Tiling] platform values out of the kernels' range: AIV cores=%lu, AIC cores=%lu (each at "
                "most %lu), UB bytes=%lu (must exceed %lu)", cores.aiv, cores.aic, UINT16_LIMIT, cores.ub,
                UB_RESERVED_BYTES);
        return ge::GRAPH_FAILED;
    }
    return ge::GRAPH_SUCCESS;
}

// ---- work split shared by both templates: the first `bigCores` cores take one unit more.
struct WorkSplit {
    uint64_t usedCores = 0;
    uint64_t perCore = 0;
    uint64_t bigCores = 0;
};

ge::graphStatus SplitWork(uint64_t units, uint64_t cores, const char *templateName, WorkSplit &split)
{
    if (units > UINT32_LIMIT || units == 0 || cores == 0) {
        OP_LOGE(OP_TYPE, "[Tiling] %s template: work units=%lu must be in [1, 2^32) with cores=%lu >= 1",
                templateName, units, cores);
        return ge::GRAPH_FAILED;
    }
    split.usedCores = std::min(cores, units);
    split.perCore = units / split.usedCores;
    split.bigCores = units % split.usedCores;
    return ge::GRAPH_SUCCESS;
}

// ---- vector template

struct VectorTile {
    uint64_t baseD = 0;
    uint64_t qBuffers = 0;
    uint64_t vBuffers = 0;
    uint64_t oBuffers = 0;
    uint64_t cacheRows = 0;
};

// UB bytes of the query, value and output tiles (each `baseD` floats on a register-aligned pitch) and statistics.
uint64_t VectorFixedUbBytes(uint64_t baseD, const VectorTile &tile)
{
    const uint64_t rowElems = AlignUp(baseD, VECTOR_ROW_ALIGN);
    return ((tile.qBuffers + tile.vBuffers + tile.oBuffers) * rowElems + VECTOR_STAT_BUFFERS * VECTOR_STAT_UB_ELEMS) *
           FP32_BYTES;
}

// The largest D tile (whole D first) whose buffers fit; the rest of UB caches whole snapshot rows.
bool SelectVectorTile(const PrepareShape &s, uint64_t ub, bool severalUnitsPerCore, VectorTile &tile)
{
    const uint64_t usable = ub - UB_RESERVED_BYTES;
    uint64_t candidates[1 + sizeof(VECTOR_BASE_D_STEPS) / sizeof(VECTOR_BASE_D_STEPS[0])] = {s.hidden};
    for (size_t i = 0; i < sizeof(VECTOR_BASE_D_STEPS) / sizeof(VECTOR_BASE_D_STEPS[0]); ++i) {
        candidates[i + 1] = std::min(s.hidden, VECTOR_BASE_D_STEPS[i]);
    }
    uint64_t previous = 0;
    for (uint64_t baseD : candidates) {
        if (baseD == previous) {
            continue;
        }
        previous = baseD;
        const uint64_t dTiles = CeilDiv(s.hidden, baseD);
        const bool pipelined = dTiles > 1 || severalUnitsPerCore;
        VectorTile t;
        t.baseD = baseD;
        t.qBuffers = pipelined ? DOUBLE_BUFFER : SINGLE_BUFFER;
        t.oBuffers = t.qBuffers;
        t.vBuffers = (dTiles * s.blocks > 1 || severalUnitsPerCore) ? DOUBLE_BUFFER : SINGLE_BUFFER;
        const uint64_t fixed = VectorFixedUbBytes(baseD, t);
        if (fixed > usable) {
            continue;
        }
        const uint64_t cacheRowBytes = AlignUp(s.hidden, VECTOR_ROW_ALIGN) * FP32_BYTES;
        t.cacheRows = std::min(s.blocks, (usable - fixed) / cacheRowBytes);
        tile = t;
        return true;
    }
    return false;
}

ge::graphStatus TileVector(const PrepareShape &s, const PrepareCores &cores, BlockAttnResPrepareVectorTilingData &td,
                           uint32_t &blockDim)
{
    const uint64_t units = s.tokens * s.queries;
    WorkSplit split;
    if (SplitWork(units, cores.aiv, "vector", split) != ge::GRAPH_SUCCESS) {
        return ge::GRAPH_FAILED;
    }
    const uint64_t tailFactor = split.perCore + (split.bigCores > 0 ? 1 : 0);
    VectorTile tile;
    if (!SelectVectorTile(s, cores.ub, tailFactor > 1, tile)) {
        OP_LOGE(OP_TYPE, "[Tiling] vector template: no D tile fits UB bytes=%lu (T=%lu N=%lu S=%lu D=%lu)", cores.ub,
                s.tokens, s.blocks, s.queries, s.hidden);
        return ge::GRAPH_FAILED;
    }
    std::memset(&td, 0, sizeof(td));  // padding included
    td.totalT = static_cast<uint32_t>(s.tokens);
    td.totalS = static_cast<uint32_t>(s.queries);
    td.totalWorkUnits = static_cast<uint32_t>(units);
    td.totalD = static_cast<uint32_t>(s.hidden);
    td.blockFactor = static_cast<uint32_t>(split.perCore);
    td.tailBlockFactor = static_cast<uint32_t>(tailFactor);
    td.baseD = static_cast<uint32_t>(tile.baseD);
    td.statUbElems = static_cast<uint32_t>(VECTOR_STAT_UB_ELEMS);
    td.eps = s.eps;
    td.usedCoreNum = static_cast<uint16_t>(split.usedCores);
    td.bigCoreNum = static_cast<uint16_t>(split.bigCores);
    td.totalN = static_cast<uint8_t>(s.blocks);
    td.vCacheRows = static_cast<uint8_t>(tile.cacheRows);
    td.qBufferNum = static_cast<uint8_t>(tile.qBuffers);
    td.vBufferNum = static_cast<uint8_t>(tile.vBuffers);
    td.oBufferNum = static_cast<uint8_t>(tile.oBuffers);
    blockDim = static_cast<uint32_t>(split.usedCores);
    return ge::GRAPH_SUCCESS;
}

// ---- mix template

struct MixTile {
    uint64_t baseT = 0, baseS = 0, baseD = 0;
    uint64_t baseDAlign = 0, sAlign = 0, nAlign = 0, mm1NAlign = 0, dTiles = 0;
    uint64_t qL1Buffers = 0, vL1Buffers = 0, vUbBuffers = 0;
};

// Buffer floats of one tile: query tile and value tile in L1, softmax weights E in L1, value rows in UB, scores,
// a reduction register and the two softmax statistics in UB.
struct MixBuffers {
    uint64_t qL1, vL1, eL1, vUb, dotUb, reduceUb, softmaxUb;
};

MixBuffers MixBufferElems(const MixTile &t)
{
    MixBuffers b{};
    b.qL1 = t.sAlign * t.baseDAlign;
    b.vL1 = t.mm1NAlign * t.baseDAlign;
    b.eL1 = t.sAlign * t.nAlign;
    b.vUb = t.nAlign * t.baseDAlign;
    b.dotUb = t.sAlign * t.nAlign + FP32_VECTOR_REG;
    b.reduceUb = FP32_VECTOR_REG;
    b.softmaxUb = MIX_STAT_VECTORS * t.sAlign;
    return b;
}

// The two matmuls: scores = Q [S, D] x V^T (N = tokens of the group * snapshots, K = D in steps of at most 64),
// then numerator = E [S, N] x V [N, D]. Each operand's L0 tile, each matmul's L1 slot, and all L1/UB buffers.
bool MixTileFits(const MixTile &t, const PrepareCores &c)
{
    const MixBuffers b = MixBufferElems(t);
    const uint64_t l1Bytes = (t.qL1Buffers * b.qL1 + t.vL1Buffers * b.vL1 + b.eL1) * FP32_BYTES;
    const uint64_t ubBytes = (t.vUbBuffers * b.vUb + b.dotUb + b.reduceUb + b.softmaxUb) * FP32_BYTES;
    const uint64_t k = std::min(t.baseDAlign, MIX_MM1_MAX_BASE_K);
    const uint64_t scoresL0A = t.sAlign * k * FP32_BYTES, numeratorL0A = t.sAlign * t.nAlign * FP32_BYTES;
    const uint64_t scoresL0B = t.mm1NAlign * k * FP32_BYTES, numeratorL0B = t.nAlign * t.baseDAlign * FP32_BYTES;
    const uint64_t scoresL0C = t.sAlign * t.mm1NAlign * FP32_BYTES, numeratorL0C = t.sAlign * t.baseDAlign * FP32_BYTES;
    const uint64_t scoresSlot = (t.sAlign + t.mm1NAlign) * t.baseDAlign * FP32_BYTES;
    const uint64_t numeratorSlot = (t.sAlign * t.nAlign + t.nAlign * t.baseDAlign) * FP32_BYTES;
    const uint64_t slot = c.l1 / MIX_L1_SLOTS;
    return l1Bytes <= c.l1 - L1_RESERVED_BYTES && ubBytes <= c.ub - UB_RESERVED_BYTES && scoresSlot <= slot &&
           numeratorSlot <= slot && std::max(scoresL0A, numeratorL0A) <= c.l0a &&
           std::max(scoresL0B, numeratorL0B) <= c.l0b && std::max(scoresL0C, numeratorL0C) <= c.l0c;
}

MixTile MakeMixTile(const PrepareShape &s, uint64_t baseS, uint64_t baseT, uint64_t baseD)
{
    MixTile t;
    t.baseT = baseT;
    t.baseS = baseS;
    t.baseD = baseD;
    t.baseDAlign = AlignUp(baseD, CUBE_BLOCK);
    t.sAlign = AlignUp(baseS, CUBE_BLOCK);
    t.nAlign = AlignUp(s.blocks, CUBE_BLOCK);
    t.mm1NAlign = AlignUp(baseT * s.blocks, CUBE_BLOCK);
    t.dTiles = CeilDiv(s.hidden, baseD);
    t.qL1Buffers = t.dTiles > 1 ? DOUBLE_BUFFER : SINGLE_BUFFER;
    t.vL1Buffers = t.qL1Buffers;
    t.vUbBuffers = DOUBLE_BUFFER;
    return t;
}

// Tokens are packed into the score matmul's N (at most one cube block of rows: baseT * N <= 16) only while that
// does not raise the tokens one core handles above the one-token-per-unit split; per (S tile, T group) the largest
// D tile that fits is taken. Whole S first, then smaller S tiles.
bool SelectMixTile(const PrepareShape &s, const PrepareCores &c, MixTile &tile)
{
    const uint64_t groups = std::min(c.aic, c.aiv / AIV_PER_AIC);
    if (groups == 0 || c.l1 <= L1_RESERVED_BYTES) {
        return false;
    }
    uint64_t previousS = 0;
    for (size_t i = 0; i <= sizeof(MIX_BASE_S_STEPS) / sizeof(MIX_BASE_S_STEPS[0]); ++i) {
        const uint64_t baseS = i == 0 ? s.queries : std::min(s.queries, MIX_BASE_S_STEPS[i - 1]);
        if (baseS == previousS) {
            continue;
        }
        previousS = baseS;
        const uint64_t sTiles = CeilDiv(s.queries, baseS);
        const uint64_t unitsPerToken = s.tokens * sTiles;
        const uint64_t tokensPerCore = CeilDiv(unitsPerToken, std::min(groups, unitsPerToken));
        for (uint64_t baseT : MIX_BASE_T_STEPS) {
            if (baseT > s.tokens || baseT * s.blocks > CUBE_BLOCK) {
                continue;
            }
            const uint64_t units = CeilDiv(s.tokens, baseT) * sTiles;
            if (CeilDiv(units, std::min(groups, units)) * baseT > tokensPerCore) {
                continue;
            }
            uint64_t previousD = 0;
            for (uint64_t step : MIX_BASE_D_STEPS) {
                const uint64_t baseD = std::min(s.hidden, step);
                if (baseD == previousD) {
                    continue;
                }
                previousD = baseD;
                const MixTile candidate = MakeMixTile(s, baseS, baseT, baseD);
                if (MixTileFits(candidate, c)) {
                    tile = candidate;
                    return true;
                }
            }
        }
    }
    return false;
}

bool MixApplies(const PrepareShape &s, const PrepareCores &c)
{
    return c.aic != 0 && c.aiv == c.aic * AIV_PER_AIC && s.tokens >= MIX_MIN_T && s.queries >= MIX_MIN_S &&
           s.hidden >= MIX_MIN_D && s.tokens <= UINT32_LIMIT / s.hidden;  // the output's row stride T * D is 32-bit
}

ge::graphStatus TileMix(const PrepareShape &s, const PrepareCores &c, const MixTile &t,
                        BlockAttnResPrepareMixTilingData &td, uint32_t &blockDim, uint64_t &workspace)
{
    const uint64_t sTiles = CeilDiv(s.queries, t.baseS);
    const uint64_t units = CeilDiv(s.tokens, t.baseT) * sTiles;
    WorkSplit split;
    if (SplitWork(units, std::min(c.aic, c.aiv / AIV_PER_AIC), "mix", split) != ge::GRAPH_SUCCESS) {
        return ge::GRAPH_FAILED;
    }
    // Per core: the scores of one tile (baseS rows on mm1NAlign pitch) and one E slot per possible token group.
    const uint64_t perCoreElems =
        t.baseS * t.mm1NAlign + std::min(s.tokens, MIX_MAX_RUNTIME_GROUPS) * t.sAlign * t.nAlign;
    workspace = c.sysWorkspace + perCoreElems * split.usedCores * FP32_BYTES;
    const MixBuffers b = MixBufferElems(t);
    std::memset(&td, 0, sizeof(td));  // padding included
    td.qL1Elems = b.qL1;
    td.vL1Elems = b.vL1;
    td.eL1Elems = b.eL1;
    td.vUbElems = b.vUb;
    td.dotUbElems = b.dotUb;
    td.reduceUbElems = b.reduceUb;
    td.softmaxUbElems = b.softmaxUb;
    td.workspacePerCoreElems = perCoreElems;
    td.totalT = static_cast<uint32_t>(s.tokens);
    td.totalS = static_cast<uint32_t>(s.queries);
    td.totalWorkUnits = static_cast<uint32_t>(units);
    td.totalD = static_cast<uint32_t>(s.hidden);
    td.baseT = static_cast<uint32_t>(t.baseT);
    td.baseS = static_cast<uint32_t>(t.baseS);
    td.baseD = static_cast<uint32_t>(t.baseD);
    td.baseDAlign = static_cast<uint32_t>(t.baseDAlign);
    td.sTileNum = static_cast<uint32_t>(sTiles);
    td.dTileNum = static_cast<uint32_t>(t.dTiles);
    td.sAlign = static_cast<uint32_t>(t.sAlign);
    td.nAlign = static_cast<uint32_t>(t.nAlign);
    td.mm1NAlign = static_cast<uint32_t>(t.mm1NAlign);
    td.dAlign = static_cast<uint32_t>(AlignUp(s.hidden, CUBE_BLOCK));
    td.eps = s.eps;
    td.usedCoreNum = static_cast<uint16_t>(split.usedCores);
    td.aicCoreNum = static_cast<uint16_t>(c.aic);
    td.aivCoreNum = static_cast<uint16_t>(c.aiv);
    td.totalN = static_cast<uint8_t>(s.blocks);
    td.qL1BufferNum = static_cast<uint8_t>(t.qL1Buffers);
    td.vL1BufferNum = static_cast<uint8_t>(t.vL1Buffers);
    td.vUbBufferNum = static_cast<uint8_t>(t.vUbBuffers);
    blockDim = static_cast<uint32_t>(split.usedCores);
    return ge::GRAPH_SUCCESS;
}

// Writes the record, workspace, key and block dim only once the whole tiling has succeeded.
template <typename Record>
ge::graphStatus Commit(gert::TilingContext *ctx, const Record &td, uint64_t workspace, uint64_t key,
                       uint32_t blockDim)
{
    if (attnres_ge::WriteTiling(ctx, OP_TYPE, td, workspace) != ge::GRAPH_SUCCESS) {
        return ge::GRAPH_FAILED;
    }
    ctx->SetTilingKey(key);
    ctx->SetBlockDim(blockDim);
    return ge::GRAPH_SUCCESS;
}

ge::graphStatus TilingBlockAttnResPrepare(gert::TilingContext *ctx)
{
    if (ctx == nullptr) {
        OP_LOGE(OP_TYPE, "[Tiling] tiling context is null");
        return ge::GRAPH_FAILED;
    }
    PrepareShape shape;
    PrepareCores cores;
    if (ReadDtypes(ctx) != ge::GRAPH_SUCCESS || ReadShapes(ctx, shape) != ge::GRAPH_SUCCESS ||
        ReadAttrs(ctx, shape) != ge::GRAPH_SUCCESS || ReadCores(ctx, cores) != ge::GRAPH_SUCCESS) {
        return ge::GRAPH_FAILED;
    }
    uint32_t blockDim = 0;
    MixTile mixTile;
    if (MixApplies(shape, cores) && SelectMixTile(shape, cores, mixTile)) {
        BlockAttnResPrepareMixTilingData td;
        uint64_t workspace = 0;
        if (TileMix(shape, cores, mixTile, td, blockDim, workspace) != ge::GRAPH_SUCCESS) {
            return ge::GRAPH_FAILED;
        }
        OP_LOGD(OP_TYPE, "[Tiling] mix: T=%lu N=%lu S=%lu D=%lu groups=%u baseT=%lu baseS=%lu baseD=%lu",
                shape.tokens, shape.blocks, shape.queries, shape.hidden, blockDim, mixTile.baseT, mixTile.baseS,
                mixTile.baseD);
        return Commit(ctx, td, workspace, PREPARE_TILING_KEY_MIX, blockDim);
    }
    BlockAttnResPrepareVectorTilingData td;
    if (TileVector(shape, cores, td, blockDim) != ge::GRAPH_SUCCESS) {
        return ge::GRAPH_FAILED;
    }
    OP_LOGD(OP_TYPE, "[Tiling] vector: T=%lu N=%lu S=%lu D=%lu cores=%u baseD=%u cacheRows=%u", shape.tokens,
            shape.blocks, shape.queries, shape.hidden, blockDim, td.baseD, static_cast<unsigned>(td.vCacheRows));
    // The vector kernel uses no workspace of its own.
    return Commit(ctx, td, cores.sysWorkspace, PREPARE_TILING_KEY_VECTOR, blockDim);
}

ge::graphStatus TilingParseBlockAttnResPrepare(gert::TilingParseContext *ctx)
{
    return attnres_ge::ParseWithoutPlatformReads<BlockAttnResPrepareCompileInfo>(ctx, OP_TYPE);
}

}  // namespace

IMPL_OP_OPTILING(BlockAttnResPrepare)
    .Tiling(TilingBlockAttnResPrepare)
    .TilingParse<BlockAttnResPrepareCompileInfo>(TilingParseBlockAttnResPrepare);

}  // namespace optiling
