// tests/cann/cann_driver.cpp -- runs op registrations through CANN's registries the way GE calls them and prints
// one JSON line per command. Linked once with our archive (build/cann-host/libattnres_ge_cann_host.a) and once
// with upstream's (libupstream_attnres_host.a from shared/cann-src), so tests/cann/test_cann_host.py can feed
// both the same commands and compare the lines.
//
// GE's flow (hicann/ge base/common/op_tiling/op_tiling_rt2.cc), as reproduced here:
//   * the op impls linked into this executable are harvested into a gert::OpImplSpaceRegistryV2 as for
//     package "main_exe", then looked up by op type;
//   * TilingParse: compile info from compile_info_creator(), a context holding {compiled json, platform, op type}
//     with the compile info as output 0; Tiling: a context with the tensors, attrs, compile info, platform,
//     16 KiB of tiling data and a workspace vector; the compile info is released with compile_info_deleter;
//   * InferShape / InferDataType through their context builders.
//
// Commands (stdin, one per line; '#' starts a comment):
//   tiling <op> <platform> <dtype> <need_backward 0|1> <T> <N> <H> [<S> [<eps>]]
//   threads <count> <op> <platform> <dtype> <need_backward 0|1> <T> <N> <H> [<S> [<eps>]]   (from <count> threads)
//   infer <op> <attrs> <dtype>:<dims> ...     attrs: grad "valid_block_num", forward
//                                              "valid_block_num,norm_eps,need_backward", prepare/update "eps";
//                                              dims "4,2,8", "-2", "s"
//   opdef
// The two-phase ops read the tiling case as: BlockAttnResPrepare block_res [T, N, H] float32, valid_blocks [1]
// uint64, pseudo_query [S, H] (dtype and need_backward ignored); BlockAttnResUpdate partial_block [T, H] (N, S and
// need_backward ignored; dtype is delta's). H is their D; eps (default 1e-6) their attribute.
// Platforms: cold (PlatFormInfos::Init only), late (cold at TilingParse, filled as hand910b2 before Tiling),
// late950 (the same, filled as hand950cube), ini910b2 / ini950 (fe::PlatformInfoManager reading Ascend910B2.ini /
// Ascend950PR_9579.ini; the manager caches one platform per device, so one driver run uses one of them),
// hand910b2, hand91093, hand950, hand950cube (built by hand), vectorcountonly (see FillVectorCountOnly).
#include <algorithm>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "base/context_builder/op_infer_datatype_context_builder.h"
#include "base/context_builder/op_infer_shape_context_builder.h"
#include "base/context_builder/op_tiling_context_builder.h"
#include "base/context_builder/op_tiling_parse_context_builder.h"
#include "base/registry/op_impl_space_registry_v2.h"
#include "base/registry/opp_package_utils.h"
#include "exe_graph/runtime/tiling_data.h"
#include "platform/platform_info.h"
#include "platform/platform_infos_def.h"
#include "register/op_impl_registry.h"
#include "register/op_impl_registry_api.h"

void PrintOpDefsJson();  // opdef_json.cpp

namespace {
using Funcs = gert::OpImplKernelRegistry::OpImplFunctionsV2;
constexpr const char *GRAD = "BlockAttentionResidualsGrad";
constexpr const char *FWD = "BlockAttentionResiduals";
constexpr const char *PREPARE = "BlockAttnResPrepare";
constexpr const char *UPDATE = "BlockAttnResUpdate";
constexpr size_t MAX_TILING_DATA_BYTES = 16U * 1024U;  // GE's kMaxTilingDataSize
constexpr size_t WORKSPACE_SLOTS = 16;

std::shared_ptr<gert::OpImplSpaceRegistryV2> g_registry;

std::string Quote(const std::string &text)
{
    return "\"" + text + "\"";
}

// One JSON object, printed whole once a command is done: the registrations log to stdout while it runs.
class JsonText {
public:
    template <typename... Args>
    JsonText &Add(const char *format, Args... args)
    {
        const int size = std::snprintf(nullptr, 0, format, args...);
        std::string part(static_cast<size_t>(size) + 1, '\0');
        std::snprintf(&part[0], part.size(), format, args...);
        part.pop_back();
        text_ += part;
        return *this;
    }
    JsonText &Raw(const std::string &part)
    {
        text_ += part;
        return *this;
    }
    std::string Object() const
    {
        return "{" + text_ + "}";
    }

private:
    std::string text_;
};

// Prints the object on destruction, so every early return still emits its line.
class JsonLine : public JsonText {
public:
    ~JsonLine()
    {
        std::printf("%s\n", Object().c_str());
    }
};

// ---------------------------------------------------------------- platforms
struct SocKeys {
    const char *socVersion, *shortSocVersion, *npuArch, *aiCores, *cubeCores, *vectorCores, *ubBytes;
    // The cube memories (AICoreSpec l1_size, l0_a/b/c_size); nullptr: not set.
    const char *l1Bytes = nullptr, *l0aBytes = nullptr, *l0bBytes = nullptr, *l0cBytes = nullptr;
};
// Ascend910B2 and Ascend910_9391: the keys of hicann/runtime's platform_config .ini files. Ascend950PR_9579: the
// version keys and core counts of that SoC (28 AIC + 56 AIV) and its UB (248 KiB), as in the kit's
// upstream/two-phase Ascend950PR_9579.ini; hand950cube adds that file's L1 and L0 sizes (hand950 has none, so
// BlockAttnResPrepare's mix template cannot fit there). Only the keys the ops read are set.
const std::map<std::string, SocKeys> HAND_BUILT = {
    {"hand910b2", {"Ascend910B2", "Ascend910B", "2201", "24", "24", "48", "196608"}},
    {"hand91093", {"Ascend910_9391", "Ascend910_93", "2201", "24", "24", "48", "196608"}},
    {"hand950", {"Ascend950PR_9579", "Ascend950", "3510", "28", "28", "56", "253952"}},
    {"hand950cube",
     {"Ascend950PR_9579", "Ascend950", "3510", "28", "28", "56", "253952", "524288", "65536", "65536", "262144"}},
};
// The SoC file each ini* platform reads, and the hand-built platform each late* platform is filled as.
const std::map<std::string, std::string> INI_SOCS = {{"ini910b2", "Ascend910B2"}, {"ini950", "Ascend950PR_9579"}};
const std::map<std::string, std::string> LATE_FILLS = {{"late", "hand910b2"}, {"late950", "hand950cube"}};

void FillByHand(fe::PlatFormInfos &platform, const SocKeys &keys)
{
    std::map<std::string, std::string> version = {
        {"SoC_version", keys.socVersion}, {"Short_SoC_version", keys.shortSocVersion}, {"NpuArch", keys.npuArch}};
    std::map<std::string, std::string> soc = {{"ai_core_cnt", keys.aiCores},
                                              {"cube_core_cnt", keys.cubeCores},
                                              {"vector_core_cnt", keys.vectorCores},
                                              {"core_type_list", "CubeCore,VectorCore"}};
    std::map<std::string, std::string> spec = {{"ub_size", keys.ubBytes}};
    const std::pair<const char *, const char *> cube[] = {
        {"l1_size", keys.l1Bytes}, {"l0_a_size", keys.l0aBytes}, {"l0_b_size", keys.l0bBytes},
        {"l0_c_size", keys.l0cBytes}};
    for (const auto &[key, value] : cube) {
        if (value != nullptr) spec[key] = value;
    }
    platform.SetPlatformRes("version", version);
    platform.SetPlatformRes("SoCInfo", soc);
    platform.SetPlatformRes("AICoreSpec", spec);
    platform.SetCoreNumByCoreType("VectorCore");
}

// As asc-devkit's PlatformAscendCManager::PlatformAscendCInit does: the real PlatformInfoManager reads
// <exe dir>/../data/platform_config/<soc>.ini.
bool FillFromIni(fe::PlatFormInfos &platform, const std::string &soc)
{
    auto &manager = fe::PlatformInfoManager::Instance();
    if (manager.InitRuntimePlatformInfos(soc.c_str()) != 0U ||
        manager.GetRuntimePlatformInfosByDevice(0U, platform) != 0U) {
        return false;
    }
    platform.SetCoreNumByCoreType("VectorCore");
    std::string cores;
    return platform.GetPlatformResWithLock("SoCInfo", "vector_core_cnt", cores) && !cores.empty();
}

// A 910B2 platform whose SoCInfo holds only vector_core_cnt (no core_type_list, no ai_core_cnt):
// PlatformAscendC::GetCoreNumAiv() reads ai_core_cnt there and returns 0; the count is still in the platform.
void FillVectorCountOnly(fe::PlatFormInfos &platform)
{
    const SocKeys &keys = HAND_BUILT.at("hand910b2");
    std::map<std::string, std::string> version = {
        {"SoC_version", keys.socVersion}, {"Short_SoC_version", keys.shortSocVersion}, {"NpuArch", keys.npuArch}};
    std::map<std::string, std::string> soc = {{"vector_core_cnt", keys.vectorCores}};
    std::map<std::string, std::string> spec = {{"ub_size", keys.ubBytes}};
    platform.SetPlatformRes("version", version);
    platform.SetPlatformRes("SoCInfo", soc);
    platform.SetPlatformRes("AICoreSpec", spec);
}

// The platform TilingParse sees; `late` is filled afterwards by FillLate.
bool MakeParsePlatform(const std::string &name, fe::PlatFormInfos &platform)
{
    platform.Init();
    if (name == "cold" || LATE_FILLS.count(name) != 0) return true;
    if (name == "vectorcountonly") {
        FillVectorCountOnly(platform);
        return true;
    }
    if (INI_SOCS.count(name) != 0) return FillFromIni(platform, INI_SOCS.at(name));
    auto it = HAND_BUILT.find(name);
    if (it == HAND_BUILT.end()) return false;
    FillByHand(platform, it->second);
    return true;
}

void FillLate(const std::string &name, fe::PlatFormInfos &platform)
{
    auto it = LATE_FILLS.find(name);
    if (it != LATE_FILLS.end()) FillByHand(platform, HAND_BUILT.at(it->second));
}

// ---------------------------------------------------------------- tensors and attrs
ge::DataType ParseDtype(const std::string &text)
{
    if (text == "float16") return ge::DT_FLOAT16;
    if (text == "bfloat16") return ge::DT_BF16;
    if (text == "float32") return ge::DT_FLOAT;
    if (text == "int32") return ge::DT_INT32;
    if (text == "uint64") return ge::DT_UINT64;
    return ge::DT_UNDEFINED;
}

const char *DtypeName(ge::DataType dtype)
{
    switch (dtype) {
        case ge::DT_FLOAT16: return "float16";
        case ge::DT_BF16: return "bfloat16";
        case ge::DT_FLOAT: return "float32";
        case ge::DT_INT32: return "int32";
        case ge::DT_UINT64: return "uint64";
        default: return "undefined";
    }
}

std::unique_ptr<gert::Tensor> MakeTensor(const std::vector<int64_t> &dims, ge::DataType dtype)
{
    auto tensor = std::make_unique<gert::Tensor>();
    tensor->SetDataType(dtype);
    tensor->SetOriginFormat(ge::FORMAT_ND);
    tensor->SetStorageFormat(ge::FORMAT_ND);
    tensor->SetPlacement(gert::kOnDeviceHbm);
    tensor->MutableOriginShape().SetDimNum(0);
    tensor->MutableStorageShape().SetDimNum(0);
    for (int64_t dim : dims) {
        tensor->MutableOriginShape().AppendDim(dim);
        tensor->MutableStorageShape().AppendDim(dim);
    }
    return tensor;
}

struct Tensors {
    std::vector<std::unique_ptr<gert::Tensor>> in, out;
    static std::vector<gert::Tensor *> Ptrs(const std::vector<std::unique_ptr<gert::Tensor>> &tensors)
    {
        std::vector<gert::Tensor *> ptrs;
        for (const auto &t : tensors) ptrs.push_back(t.get());
        return ptrs;
    }
};

bool IsTwoPhase(const std::string &op)
{
    return op == PREPARE || op == UPDATE;
}

size_t OutputCount(const std::string &op)
{
    if (op == GRAD) return 4;
    if (op == UPDATE) return 2;
    return 3;
}

// Attributes in OpDef order: grad {valid_block_num}; forward {valid_block_num, norm_eps, need_backward};
// prepare and update {eps}.
struct Attrs {
    int64_t validBlockNum = 0;
    float normEps = 1e-6F;
    bool needBackward = false;
    float eps = 1e-6F;
};

template <typename Builder>
void AppendAttrs(Builder &builder, const std::string &op, const Attrs &attrs)
{
    if (IsTwoPhase(op)) {
        builder.AppendAttr(attrs.eps);
        return;
    }
    builder.AppendAttr(attrs.validBlockNum);
    if (op != GRAD) builder.AppendAttr(attrs.normEps).AppendAttr(attrs.needBackward);
}

// BlockAttnResPrepare: block_res [T, N, D], valid_blocks [1], pseudo_query [S, D] -> numerator [S, T, D],
// logit_max [S, T], exp_sum [S, T]. BlockAttnResUpdate: partial_block [T, D] float32, delta [T, D] `dtype`,
// pseudo_query [D], numerator [T, D], logit_max [T], exp_sum [T] -> partial_block [T, D], h [T, D] `dtype`.
Tensors TwoPhaseTilingTensors(const std::string &op, int64_t T, int64_t N, int64_t D, int64_t S, ge::DataType dtype)
{
    Tensors t;
    if (op == PREPARE) {
        t.in.push_back(MakeTensor({T, N, D}, ge::DT_FLOAT));
        t.in.push_back(MakeTensor({1}, ge::DT_UINT64));
        t.in.push_back(MakeTensor({S, D}, ge::DT_FLOAT));
        t.out.push_back(MakeTensor({S, T, D}, ge::DT_FLOAT));
        t.out.push_back(MakeTensor({S, T}, ge::DT_FLOAT));
        t.out.push_back(MakeTensor({S, T}, ge::DT_FLOAT));
        return t;
    }
    t.in.push_back(MakeTensor({T, D}, ge::DT_FLOAT));
    t.in.push_back(MakeTensor({T, D}, dtype));
    t.in.push_back(MakeTensor({D}, ge::DT_FLOAT));
    t.in.push_back(MakeTensor({T, D}, ge::DT_FLOAT));
    t.in.push_back(MakeTensor({T}, ge::DT_FLOAT));
    t.in.push_back(MakeTensor({T}, ge::DT_FLOAT));
    t.out.push_back(MakeTensor({T, D}, ge::DT_FLOAT));
    t.out.push_back(MakeTensor({T, D}, dtype));
    return t;
}

Tensors TilingTensors(bool grad, int64_t T, int64_t N, int64_t H, ge::DataType dtype, bool needBackward)
{
    Tensors t;
    t.in.push_back(MakeTensor({T, H}, dtype));
    t.in.push_back(MakeTensor({T, N, H}, dtype));
    t.in.push_back(MakeTensor({1, H}, dtype));
    t.in.push_back(MakeTensor({H}, dtype));
    if (grad) {
        t.in.push_back(MakeTensor({T, H}, dtype));
        t.in.push_back(MakeTensor({T, N + 1}, ge::DT_FLOAT));
        t.in.push_back(MakeTensor({T, N + 1}, ge::DT_FLOAT));
        t.out.push_back(MakeTensor({T, H}, dtype));
        t.out.push_back(MakeTensor({T, N, H}, dtype));
        t.out.push_back(MakeTensor({1, H}, dtype));
        t.out.push_back(MakeTensor({H}, dtype));
    } else {
        const std::vector<int64_t> saved = needBackward ? std::vector<int64_t>{T, N + 1} : std::vector<int64_t>{0};
        t.out.push_back(MakeTensor({T, H}, dtype));
        t.out.push_back(MakeTensor(saved, ge::DT_FLOAT));
        t.out.push_back(MakeTensor(saved, ge::DT_FLOAT));
    }
    return t;
}

const Funcs *Lookup(const std::string &op)
{
    return g_registry == nullptr ? nullptr : g_registry->GetOpImpl(op.c_str());
}

// ---------------------------------------------------------------- commands
struct CompileInfoHolder {
    const Funcs *funcs = nullptr;
    void *info = nullptr;
    ~CompileInfoHolder()
    {
        if (funcs != nullptr && info != nullptr && funcs->compile_info_deleter != nullptr) {
            funcs->compile_info_deleter(info);
        }
    }
};

uint32_t RunTilingParse(const std::string &op, const Funcs *funcs, size_t inputs, size_t outputs,
                        fe::PlatFormInfos *platform, CompileInfoHolder &compileInfo)
{
    compileInfo.funcs = funcs;
    compileInfo.info = funcs->compile_info_creator();
    auto holder = gert::OpTilingParseContextBuilder()
                      .OpType(op.c_str())
                      .OpName(op.c_str())
                      .IONum(inputs, outputs)
                      .CompiledJson("{}")
                      .CompiledInfo(compileInfo.info)
                      .PlatformInfo(platform)
                      .Build();
    if (holder.GetContext() == nullptr) return ge::GRAPH_FAILED;
    return funcs->tiling_parse(reinterpret_cast<gert::KernelContext *>(holder.GetContext()));
}

std::string Hex(const uint8_t *data, size_t size)
{
    static const char digits[] = "0123456789abcdef";
    std::string out;
    for (size_t i = 0; i < size; ++i) {
        out += digits[data[i] >> 4];
        out += digits[data[i] & 15];
    }
    return out;
}

struct TilingCase {
    std::string op, platformName, dtypeName;
    int needBackward = 0;
    int64_t T = 0, N = 0, H = 0, S = 0;
    float eps = 1e-6F;
};

TilingCase ReadTilingCase(std::istringstream &args)
{
    TilingCase c;
    args >> c.op >> c.platformName >> c.dtypeName >> c.needBackward >> c.T >> c.N >> c.H;
    if (!(args >> c.S)) c.S = 0;  // only BlockAttnResPrepare reads S
    std::string eps;
    if (args >> eps) c.eps = std::strtof(eps.c_str(), nullptr);  // "inf" and "nan" too
    return c;
}

// TilingParse then Tiling of one case on a platform of its own, as GE runs them for one node.
void RunTilingCase(const TilingCase &c, JsonText &out)
{
    const std::string &op = c.op, &platformName = c.platformName, &dtypeName = c.dtypeName;
    const int needBackward = c.needBackward;
    const int64_t T = c.T, N = c.N, H = c.H;
    const bool grad = op == GRAD;
    out.Add("\"cmd\":\"tiling\",\"op\":%s,\"platform\":%s,\"dtype\":%s,\"need_backward\":%d,"
                "\"T\":%" PRId64 ",\"N\":%" PRId64 ",\"H\":%" PRId64 ",\"S\":%" PRId64,
                Quote(op).c_str(), Quote(platformName).c_str(), Quote(dtypeName).c_str(), needBackward, T, N, H, c.S);
    const Funcs *funcs = Lookup(op);
    fe::PlatFormInfos platform;
    if (funcs == nullptr || funcs->tiling == nullptr || funcs->tiling_parse == nullptr ||
        !MakeParsePlatform(platformName, platform)) {
        out.Add(",\"error\":\"op not registered or platform unavailable\"");
        return;
    }
    Tensors tensors = IsTwoPhase(op) ? TwoPhaseTilingTensors(op, T, N, H, c.S, ParseDtype(dtypeName))
                                     : TilingTensors(grad, T, N, H, ParseDtype(dtypeName), needBackward != 0);
    CompileInfoHolder compileInfo;
    const uint32_t parseRc =
        RunTilingParse(op, funcs, tensors.in.size(), tensors.out.size(), &platform, compileInfo);
    out.Add(",\"parse_rc\":%u", parseRc);
    if (parseRc != ge::GRAPH_SUCCESS) {  // GE stops here
        return;
    }
    FillLate(platformName, platform);
    Attrs attrs;
    attrs.validBlockNum = grad ? 0 : -1;
    attrs.needBackward = needBackward != 0;
    attrs.eps = c.eps;
    auto workspace = gert::ContinuousVector::Create<size_t>(WORKSPACE_SLOTS);
    gert::OpTilingContextBuilder builder;
    builder.OpType(op.c_str()).OpName(op.c_str()).IONum(tensors.in.size(), tensors.out.size());
    AppendAttrs(builder, op, attrs);
    auto holder = builder.InputTensors(Tensors::Ptrs(tensors.in))
                      .OutputTensors(Tensors::Ptrs(tensors.out))
                      .CompileInfo(compileInfo.info)
                      .PlatformInfo(&platform)
                      .TilingDataSize(MAX_TILING_DATA_BYTES)
                      .Workspace(reinterpret_cast<gert::ContinuousVector *>(workspace.get()))
                      .Build();
    gert::TilingContext *ctx = holder.GetContext();
    if (ctx == nullptr) {
        out.Add(",\"error\":\"tiling context build failed\"");
        return;
    }
    const uint32_t rc = funcs->tiling(ctx);
    out.Add(",\"rc\":%u", rc);
    if (rc == ge::GRAPH_SUCCESS) {
        auto *slots = reinterpret_cast<gert::ContinuousVector *>(workspace.get());
        const size_t ws0 = slots->GetSize() > 0 ? reinterpret_cast<const size_t *>(slots->GetData())[0] : 0U;
        const gert::TilingData *data = ctx->GetRawTilingData();
        out.Add(",\"key\":%" PRIu64 ",\"block_dim\":%u,\"schedule_mode\":%u,\"workspace\":%zu,"
                    "\"workspace_count\":%zu,\"data\":\"%s\"",
                    ctx->GetTilingKey(), ctx->GetBlockDim(), ctx->GetScheduleMode(), ws0, slots->GetSize(),
                    Hex(reinterpret_cast<const uint8_t *>(data->GetData()), data->GetDataSize()).c_str());
    }
}

void CommandTiling(std::istringstream &args)
{
    JsonLine out;
    RunTilingCase(ReadTilingCase(args), out);
}

// threads <count> <tiling case>: the same case run at once from <count> threads (first calls of a process).
void CommandThreads(std::istringstream &args)
{
    int count = 0;
    args >> count;
    const TilingCase c = ReadTilingCase(args);
    std::vector<JsonText> results(static_cast<size_t>(std::max(count, 0)));
    std::vector<std::thread> threads;
    for (auto &result : results) threads.emplace_back([&c, &result] { RunTilingCase(c, result); });
    for (auto &thread : threads) thread.join();
    JsonLine out;
    out.Add("\"cmd\":\"threads\",\"results\":[");
    for (size_t i = 0; i < results.size(); ++i) out.Raw((i ? "," : "") + results[i].Object());
    out.Raw("]");
}

std::vector<int64_t> ParseDims(const std::string &text)
{
    std::vector<int64_t> dims;
    if (text == "s") return dims;  // scalar
    std::istringstream in(text);
    std::string item;
    while (std::getline(in, item, ',')) dims.push_back(std::strtoll(item.c_str(), nullptr, 10));
    return dims;
}

std::string DimsJson(const gert::Shape *shape)
{
    if (shape == nullptr) return "null";
    std::string out = "[";
    for (size_t i = 0; i < shape->GetDimNum(); ++i) out += (i ? "," : "") + std::to_string(shape->GetDim(i));
    return out + "]";
}

void CommandInfer(std::istringstream &args)
{
    std::string op, attrText, tensorText;
    args >> op >> attrText;
    Attrs attrs;
    {
        std::istringstream in(attrText);
        std::string item;
        std::vector<std::string> items;
        while (std::getline(in, item, ',')) items.push_back(item);
        if (IsTwoPhase(op)) {
            attrs.eps = items.empty() ? 1e-6F : std::strtof(items[0].c_str(), nullptr);
        } else {
            attrs.validBlockNum = items.empty() ? 0 : std::strtoll(items[0].c_str(), nullptr, 10);
        }
        if (!IsTwoPhase(op) && items.size() >= 3) {
            attrs.normEps = std::strtof(items[1].c_str(), nullptr);
            attrs.needBackward = items[2] == "1";
        }
    }
    Tensors tensors;
    std::vector<ge::DataType> dtypes;
    while (args >> tensorText) {
        const size_t colon = tensorText.find(':');
        dtypes.push_back(ParseDtype(tensorText.substr(0, colon)));
        tensors.in.push_back(MakeTensor(ParseDims(tensorText.substr(colon + 1)), dtypes.back()));
        tensors.in.back()->SetPlacement(gert::kOnHost);
    }
    const size_t outputs = OutputCount(op);
    JsonLine out;
    out.Add("\"cmd\":\"infer\",\"op\":%s", Quote(op).c_str());
    const Funcs *funcs = Lookup(op);
    if (funcs == nullptr || funcs->infer_shape == nullptr || funcs->infer_datatype == nullptr) {
        out.Add(",\"error\":\"no infer_shape/infer_datatype registered\"");
        return;
    }
    gert::OpInferShapeContextBuilder shapeBuilder;
    shapeBuilder.OpType(op.c_str()).OpName(op.c_str()).IONum(tensors.in.size(), outputs);
    AppendAttrs(shapeBuilder, op, attrs);
    for (size_t i = 0; i < outputs; ++i) shapeBuilder.OutputTensorDesc(i, ge::DT_FLOAT, ge::FORMAT_ND, ge::FORMAT_ND);
    auto shapeHolder = shapeBuilder.InputTensors(Tensors::Ptrs(tensors.in)).Build();
    gert::InferShapeContext *shapeCtx = shapeHolder.GetContext();
    const uint32_t shapeRc = shapeCtx == nullptr ? ge::GRAPH_FAILED : funcs->infer_shape(shapeCtx);
    out.Add(",\"shape_rc\":%u,\"shapes\":[", shapeRc);
    for (size_t i = 0; shapeRc == ge::GRAPH_SUCCESS && i < outputs; ++i) {
        out.Raw((i ? "," : "") + DimsJson(shapeCtx->GetOutputShape(i)));
    }
    gert::OpInferDataTypeContextBuilder dtypeBuilder;
    dtypeBuilder.OpType(op.c_str()).OpName(op.c_str()).IONum(tensors.in.size(), outputs);
    AppendAttrs(dtypeBuilder, op, attrs);
    for (size_t i = 0; i < dtypes.size(); ++i) dtypeBuilder.InputTensorDesc(i, dtypes[i], ge::FORMAT_ND, ge::FORMAT_ND);
    for (size_t i = 0; i < outputs; ++i) dtypeBuilder.OutputTensorDesc(i, ge::FORMAT_ND, ge::FORMAT_ND);
    auto dtypeHolder = dtypeBuilder.Build();
    gert::InferDataTypeContext *dtypeCtx = dtypeHolder.GetContext();
    const uint32_t dtypeRc = dtypeCtx == nullptr ? ge::GRAPH_FAILED : funcs->infer_datatype(dtypeCtx);
    out.Add("],\"dtype_rc\":%u,\"dtypes\":[", dtypeRc);
    for (size_t i = 0; dtypeRc == ge::GRAPH_SUCCESS && i < outputs; ++i) {
        out.Raw(std::string(i ? "," : "") + Quote(DtypeName(dtypeCtx->GetOutputDataType(i))));
    }
    out.Raw("]");
}

bool HarvestRegistry()
{
    g_registry = std::make_shared<gert::OpImplSpaceRegistryV2>();
    const gert::OppSoDesc mainExe({ge::AscendString("main_exe")}, ge::AscendString("main_exe"));
    return g_registry->AddSoToRegistry(mainExe) == ge::GRAPH_SUCCESS;
}
}  // namespace

int main()
{
    if (!HarvestRegistry()) {
        std::printf("{\"cmd\":\"start\",\"error\":\"OpImplSpaceRegistryV2::AddSoToRegistry(main_exe) failed\"}\n");
        return 2;
    }
    std::string line;
    while (std::getline(std::cin, line)) {
        std::istringstream args(line);
        std::string command;
        if (!(args >> command) || command[0] == '#') continue;
        if (command == "tiling") {
            CommandTiling(args);
        } else if (command == "threads") {
            CommandThreads(args);
        } else if (command == "infer") {
            CommandInfer(args);
        } else if (command == "opdef") {
            PrintOpDefsJson();
        } else {
            std::printf("{\"cmd\":%s,\"error\":\"unknown command\"}\n", Quote(command).c_str());
        }
        std::fflush(stdout);
    }
    return 0;
}
