/*!
 * \file attnres_platform_resolve.h
 * \brief The platform facts both ops' Tiling reads (vector cores, UB, system workspace, NPU arch), resolved
 *        when Tiling runs and never 0.
 *
 * GE may run TilingParse before the runtime has filled the op's fe::PlatFormInfos (a cold platform), so neither
 * op reads a platform fact in TilingParse. Tiling reads them through platform_ascendc::PlatformAscendC; if a value
 * is still missing it re-reads the same PlatFormInfos (see the .cpp for what a re-query can and cannot reach), and
 * if that is missing too it falls back to 1 vector core and the smallest UB of the SoCs the OpDefs configure,
 * with a warning naming the op, the stage and the values read. ATTNRES_GE_STRICT_PLATFORM=1 turns the fallback
 * into a logged failure.
 */
#ifndef ATTNRES_GE_OP_HOST_PLATFORM_RESOLVE_H
#define ATTNRES_GE_OP_HOST_PLATFORM_RESOLVE_H

#include <cstdint>
#include <cstring>

#include "exe_graph/runtime/tiling_context.h"
#include "exe_graph/runtime/tiling_parse_context.h"
#include "graph/ge_error_codes.h"
#include "log/log.h"

namespace attnres_ge {

// Smallest usable UB among the SoCs both OpDefs configure (ascend910b, ascend910_93, ascend950):
// 910B/910_93 have 196608 bytes, of which PlatformAscendC reports 196352 after its 256-byte KFC reserve.
constexpr uint64_t FALLBACK_UB_BYTES = 196352UL;
// Largest system (library API) workspace among those SoCs: 16 MiB on NpuArch 2201 and 3510. Too much workspace
// only costs memory; too little would let the kernel write past its allocation.
constexpr uint64_t FALLBACK_SYS_WORKSPACE_BYTES = 16UL * 1024UL * 1024UL;
constexpr uint32_t FALLBACK_VECTOR_CORE_NUM = 1U;
constexpr const char *STRICT_PLATFORM_ENV = "ATTNRES_GE_STRICT_PLATFORM";

struct ResolvedPlatform {
    uint32_t vectorCoreNum = FALLBACK_VECTOR_CORE_NUM;  // >= 1
    uint64_t ubSize = FALLBACK_UB_BYTES;                 // > 0, as PlatformAscendC::GetCoreMemSize(UB) reports it
    uint64_t sysWorkspaceSize = FALLBACK_SYS_WORKSPACE_BYTES;
    bool regbase = false;    // NpuArch 3510 / 5102: the ascend950 ("arch35") kernels
    int32_t npuArch = 0;     // the platform's NpuArch; 0 when it has none
    bool fellBack = false;   // some value came from the fallback, not the platform
};

// True when ATTNRES_GE_STRICT_PLATFORM is set to a non-empty value other than "0".
bool StrictPlatform();

// Resolves the platform of `ctx` for op `opType` (used in log lines). GRAPH_FAILED only when the context has no
// platform handle, or when a fallback is needed and strict mode is on; each failure is logged.
ge::graphStatus ResolvePlatform(gert::TilingContext *ctx, const char *opType, ResolvedPlatform &out);

// Both ops' Tiling output: the kernel's tiling record (copied whole, padding included) and workspace[0].
template <typename TilingData>
ge::graphStatus WriteTiling(gert::TilingContext *ctx, const char *opType, const TilingData &record,
                            uint64_t workspaceBytes)
{
    gert::TilingData *raw = ctx->GetRawTilingData();
    size_t *workspaces = ctx->GetWorkspaceSizes(1);
    if (raw == nullptr || raw->GetData() == nullptr || raw->GetCapacity() < sizeof(record) || workspaces == nullptr) {
        OP_LOGE(opType, "[Tiling] tiling data buffer (need %zu bytes) or workspace slot missing from the context",
                sizeof(record));
        return ge::GRAPH_FAILED;
    }
    std::memcpy(raw->GetData(), &record, sizeof(record));
    raw->SetDataSize(sizeof(record));
    workspaces[0] = static_cast<size_t>(workspaceBytes);
    return ge::GRAPH_SUCCESS;
}

// Both ops' TilingParse: the context, its compile info and its platform handle must exist; no platform fact is
// read (the platform may not be filled in yet), so a cold platform never fails here.
template <typename CompileInfo>
ge::graphStatus ParseWithoutPlatformReads(gert::TilingParseContext *ctx, const char *opType)
{
    if (ctx == nullptr) {
        OP_LOGE(opType, "[TilingParse] tiling parse context is null");
        return ge::GRAPH_FAILED;
    }
    auto *compileInfo = ctx->GetCompiledInfo<CompileInfo>();
    if (compileInfo == nullptr || ctx->GetPlatformInfo() == nullptr) {
        OP_LOGE(opType, "[TilingParse] %s is null", compileInfo == nullptr ? "compile info" : "platform info");
        return ge::GRAPH_FAILED;
    }
    compileInfo->parsed = 1;
    return ge::GRAPH_SUCCESS;
}

}  // namespace attnres_ge

#endif  // ATTNRES_GE_OP_HOST_PLATFORM_RESOLVE_H
