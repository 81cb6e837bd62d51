/*!
 * \file attnres_platform_resolve.cpp
 * \brief Cold-start-safe platform reads shared by both ops' Tiling (see the header).
 *
 * What a "re-query" can reach: Tiling gets one fe::PlatFormInfos from GE, the object GE fills from its
 * PlatformInfoManager for the SoC being compiled for. There is no API an op can call to make GE fill it, so the
 * re-query reads that same object again, after the first read, through its locking getters:
 * PlatFormInfos::GetCoreNumByType("VectorCore") (SoCInfo.vector_core_cnt, whatever core_type_list says) and
 * PlatFormInfos::GetCoreNum() (the count GE sets with SetCoreNumByCoreType). That catches a platform GE fills
 * between TilingParse and Tiling or while the first read runs. The process-wide fe::PlatformInfoManager is not
 * asked: GetRuntimePlatformInfosByDevice caches a copy per device on first use, so asking it while the runtime is
 * not initialised would pin an empty platform for that device for the rest of the process.
 */
#include "attnres_platform_resolve.h"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>
#include <string>

#include "log/log.h"
#include "platform/platform_infos_def.h"
#include "tiling/platform/platform_ascendc.h"

namespace attnres_ge {
namespace {

constexpr int32_t NPU_ARCH_DAV_3510 = 3510;  // ascend950
constexpr int32_t NPU_ARCH_DAV_5102 = 5102;  // the other regbase arch ops-transformer knows

struct PlatformReading {
    uint32_t vectorCoreNum = 0;
    uint64_t ubSize = 0;
    int32_t npuArch = 0;  // 0: not in the platform
};

// What PlatformAscendC reports; the same calls upstream makes, so a warm platform gives upstream's values.
PlatformReading ReadThroughAscendC(fe::PlatFormInfos *platform)
{
    PlatformReading reading;
    const platform_ascendc::PlatformAscendC ascendc(platform);
    reading.vectorCoreNum = ascendc.GetCoreNumAiv();
    ascendc.GetCoreMemSize(platform_ascendc::CoreMemType::UB, reading.ubSize);
    std::string arch;
    if (platform->GetPlatformResWithLock("version", "NpuArch", arch) && !arch.empty()) {
        reading.npuArch = std::atoi(arch.c_str());
    }
    return reading;
}

uint32_t RequeryVectorCoreNum(fe::PlatFormInfos *platform)
{
    const uint32_t byType = platform->GetCoreNumByType("VectorCore");
    // GetCoreNumByType returns uint32_t(-1) when the stored value does not parse.
    if (byType != 0U && byType != UINT32_MAX) {
        return byType;
    }
    return platform->GetCoreNum();
}

// Warn once per op and process: Tiling runs for every new shape, and the fallback stays the same.
void WarnOnce(const char *opType, const char *message)
{
    static std::mutex mutex;
    static std::set<std::string> warned;
    std::lock_guard<std::mutex> lock(mutex);
    if (warned.insert(opType).second) {
        OP_LOGW(opType, "%s", message);
    }
}

}  // namespace

bool StrictPlatform()
{
    const char *value = std::getenv(STRICT_PLATFORM_ENV);
    return value != nullptr && value[0] != '\0' && std::strcmp(value, "0") != 0;
}

ge::graphStatus ResolvePlatform(gert::TilingContext *ctx, const char *opType, ResolvedPlatform &out)
{
    fe::PlatFormInfos *platform = ctx->GetPlatformInfo();
    if (platform == nullptr) {
        OP_LOGE(opType, "[Tiling] the tiling context carries no platform info (fe::PlatFormInfos is null)");
        return ge::GRAPH_FAILED;
    }
    PlatformReading reading = ReadThroughAscendC(platform);
    if (reading.vectorCoreNum == 0U || reading.ubSize == 0U || reading.npuArch <= 0) {
        const PlatformReading second = ReadThroughAscendC(platform);
        reading.ubSize = second.ubSize;
        reading.npuArch = second.npuArch;
        reading.vectorCoreNum = second.vectorCoreNum != 0U ? second.vectorCoreNum : RequeryVectorCoreNum(platform);
    }

    out = ResolvedPlatform{};
    out.npuArch = reading.npuArch > 0 ? reading.npuArch : 0;
    out.regbase = reading.npuArch == NPU_ARCH_DAV_3510 || reading.npuArch == NPU_ARCH_DAV_5102;
    const bool complete = reading.vectorCoreNum != 0U && reading.ubSize != 0U && reading.npuArch > 0;
    if (complete) {
        out.vectorCoreNum = reading.vectorCoreNum;
        out.ubSize = reading.ubSize;
        out.sysWorkspaceSize = platform_ascendc::PlatformAscendC(platform).GetLibApiWorkSpaceSize();
        return ge::GRAPH_SUCCESS;
    }

    char message[512];
    if (StrictPlatform()) {
        (void)std::snprintf(message, sizeof(message),
                            "[Tiling] platform info still incomplete after a re-query (vector cores=%u, UB bytes=%lu, "
                            "NpuArch=%d); %s=1 forbids the fallback to %u core / %lu UB bytes",
                            reading.vectorCoreNum, static_cast<unsigned long>(reading.ubSize), reading.npuArch,
                            STRICT_PLATFORM_ENV, FALLBACK_VECTOR_CORE_NUM,
                            static_cast<unsigned long>(FALLBACK_UB_BYTES));
        OP_LOGE(opType, "%s", message);
        return ge::GRAPH_FAILED;
    }
    out.fellBack = true;
    if (reading.vectorCoreNum != 0U) {
        out.vectorCoreNum = reading.vectorCoreNum;
    }
    if (reading.ubSize != 0U) {
        out.ubSize = reading.ubSize;
    }
    if (reading.npuArch > 0) {
        out.sysWorkspaceSize = platform_ascendc::PlatformAscendC(platform).GetLibApiWorkSpaceSize();
    }
    (void)std::snprintf(message, sizeof(message),
                        "[Tiling] platform info incomplete after a re-query (vector cores=%u, UB bytes=%lu, "
                        "NpuArch=%d); using vector cores=%u, UB bytes=%lu, system workspace=%lu, %s UB "
                        "formulas (correct, slower). Set %s=1 to fail instead.",
                        reading.vectorCoreNum, static_cast<unsigned long>(reading.ubSize), reading.npuArch,
                        out.vectorCoreNum, static_cast<unsigned long>(out.ubSize),
                        static_cast<unsigned long>(out.sysWorkspaceSize), out.regbase ? "regbase" : "non-regbase",
                        STRICT_PLATFORM_ENV);
    WarnOnce(opType, message);
    return ge::GRAPH_SUCCESS;
}

}  // namespace attnres_ge
