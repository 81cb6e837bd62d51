// tests/cann/opdef_json.cpp -- prints the OpDef registry (what OP_ADD registered) as one JSON line per op.
// ops::OpDefFactory and the OpDef getters are private (friends: CANN's opbuild generators), so this one
// translation unit is compiled with -fno-access-control; nothing else in the tier needs it.
#include <cstdio>
#include <string>
#include <vector>

#include "register/op_def_factory.h"
#include "register/op_def_registry.h"

namespace {
std::string Quote(const std::string &text)
{
    std::string out = "\"";
    for (char c : text) {
        if (c == '"' || c == '\\') out += '\\';
        out += c;
    }
    return out + "\"";
}

const char *DtypeName(ge::DataType dtype)
{
    switch (dtype) {
        case ge::DT_FLOAT: return "float32";
        case ge::DT_FLOAT16: return "float16";
        case ge::DT_BF16: return "bfloat16";
        case ge::DT_UINT64: return "uint64";
        default: return "other";
    }
}

const char *FormatName(ge::Format format)
{
    return format == ge::FORMAT_ND ? "ND" : "other";
}

const char *PresenceName(ops::Option option)
{
    switch (option) {
        case ops::REQUIRED: return "required";
        case ops::OPTIONAL: return "optional";
        case ops::DYNAMIC: return "dynamic";
        default: return "other";
    }
}

template <typename T, typename F>
std::string JsonList(const std::vector<T> &items, F toText)
{
    std::string out = "[";
    for (size_t i = 0; i < items.size(); ++i) out += (i ? "," : "") + toText(items[i]);
    return out + "]";
}

std::string ParamsJson(std::vector<ops::OpParamDef> &params)
{
    std::string out = "[";
    for (size_t i = 0; i < params.size(); ++i) {
        ops::OpParamDef &p = params[i];
        out += std::string(i ? "," : "") + "{\"name\":" + Quote(p.GetParamName().GetString()) +
               ",\"presence\":" + Quote(PresenceName(p.GetParamType())) +
               ",\"dtypes\":" + JsonList(p.GetDataTypes(), [](ge::DataType d) { return Quote(DtypeName(d)); }) +
               ",\"formats\":" + JsonList(p.GetFormats(), [](ge::Format f) { return Quote(FormatName(f)); }) +
               ",\"unknown_shape_formats\":" +
               JsonList(p.GetUnknownShapeFormats(), [](ge::Format f) { return Quote(FormatName(f)); }) +
               ",\"format_list\":" + (p.IsFormatList() ? "true" : "false") +
               ",\"formats_list\":" +
               JsonList(p.GetFormatsList(), [](ge::Format f) { return Quote(FormatName(f)); }) +
               ",\"auto_contiguous\":" + (p.GetAutoContiguous() ? "true" : "false") +
               ",\"ignore_contiguous\":" + (p.GetIgnoreContiguous() ? "true" : "false") + "}";
    }
    return out + "]";
}
}  // namespace

void PrintOpDefsJson()
{
    for (auto &name : ops::OpDefFactory::GetAllOp()) {
        ops::OpDef def = ops::OpDefFactory::OpDefCreate(name.GetString());
        std::string attrs = "[";
        bool first = true;
        for (auto &attr : def.GetAttrs()) {
            attrs += std::string(first ? "" : ",") + "{\"name\":" + Quote(attr.GetName().GetString()) +
                     ",\"type\":" + Quote(attr.GetCfgDataType().GetString()) +
                     ",\"required\":" + (attr.IsRequired() ? "true" : "false") +
                     ",\"default\":" + Quote(attr.GetAttrDefaultVal("[]").GetString()) + "}";
            first = false;
        }
        attrs += "]";
        std::string configs = "{";
        first = true;
        for (auto &soc : def.AICore().GetAICoreConfigs()) {
            std::string info = "{";
            bool firstKey = true;
            for (auto &kv : soc.second.GetCfgInfo()) {
                info += std::string(firstKey ? "" : ",") + Quote(kv.first.GetString()) + ":" +
                        Quote(kv.second.GetString());
                firstKey = false;
            }
            configs += std::string(first ? "" : ",") + Quote(soc.first.GetString()) + ":" + info + "}";
            first = false;
        }
        configs += "}";
        std::printf("{\"cmd\":\"opdef\",\"op\":%s,\"inputs\":%s,\"outputs\":%s,\"attrs\":%s,\"aicore\":%s}\n",
                    Quote(name.GetString()).c_str(), ParamsJson(def.GetInputs()).c_str(),
                    ParamsJson(def.GetOutputs()).c_str(), attrs.c_str(), configs.c_str());
    }
}
