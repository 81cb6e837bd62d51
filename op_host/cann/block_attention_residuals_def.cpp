/*!
 * \file block_attention_residuals_def.cpp
 * \brief OpDef of BlockAttentionResiduals: the inputs, outputs (inv_norm and probs OPTIONAL: present when
 *        need_backward is true), dtype combinations, formats, attributes and per-SoC AICore configs of
 *        hicann/ops-transformer mhc/block_attention_residuals (commit 6579238), so a package holding it runs
 *        CANN's kernels of that op unchanged.
 */
#include <vector>

#include "register/op_def_registry.h"

namespace ops {
namespace {
// Dtype combination i of the op is entry i of every tensor's list.
const std::vector<ge::DataType> FWD_FLOAT_DTYPES = {ge::DT_BF16, ge::DT_FLOAT16, ge::DT_FLOAT};
const std::vector<ge::DataType> FWD_FP32_DTYPES = {ge::DT_FLOAT, ge::DT_FLOAT, ge::DT_FLOAT};
const std::vector<ge::Format> FWD_ND_FORMATS = {ge::FORMAT_ND, ge::FORMAT_ND, ge::FORMAT_ND};

void DeclareND(OpParamDef &param, Option presence, const std::vector<ge::DataType> &dtypes)
{
    param.ParamType(presence).DataType(dtypes).Format(FWD_ND_FORMATS).UnknownShapeFormat(FWD_ND_FORMATS);
}

OpAICoreConfig ForwardAICoreConfig()
{
    OpAICoreConfig config;
    config.DynamicCompileStaticFlag(true)
        .DynamicFormatFlag(true)
        .DynamicRankSupportFlag(true)
        .DynamicShapeSupportFlag(true)
        .NeedCheckSupportFlag(false);
    return config;
}
}  // namespace

class BlockAttentionResiduals : public OpDef {
public:
    explicit BlockAttentionResiduals(const char *name) : OpDef(name)
    {
        for (const char *input : {"partial_block", "block_res", "proj_weight", "norm_weight"}) {
            DeclareND(this->Input(input), REQUIRED, FWD_FLOAT_DTYPES);
        }
        DeclareND(this->Output("hidden_states"), REQUIRED, FWD_FLOAT_DTYPES);
        DeclareND(this->Output("inv_norm"), OPTIONAL, FWD_FP32_DTYPES);
        DeclareND(this->Output("probs"), OPTIONAL, FWD_FP32_DTYPES);
        this->Attr("valid_block_num").AttrType(OPTIONAL).Int(-1);
        this->Attr("norm_eps").AttrType(OPTIONAL).Float(1e-6F);
        this->Attr("need_backward").AttrType(OPTIONAL).Bool(false);

        OpAICoreConfig arch22 = ForwardAICoreConfig();
        this->AICore().AddConfig("ascend910b", arch22);
        this->AICore().AddConfig("ascend910_93", arch22);
        OpAICoreConfig regbase = ForwardAICoreConfig();
        regbase.ExtendCfgInfo("opFile.value", "block_attention_residuals_apt");  // ascend950 regbase kernel entry
        this->AICore().AddConfig("ascend950", regbase);
    }
};

OP_ADD(BlockAttentionResiduals);
}  // namespace ops
