/*!
 * \file block_attention_residuals_grad_def.cpp
 * \brief OpDef of BlockAttentionResidualsGrad: the inputs, outputs, dtype combinations, formats, attribute and
 *        per-SoC AICore configs of hicann/ops-transformer mhc/block_attention_residuals_grad (commit 7e33129), so
 *        a package holding it runs CANN's kernels of that op unchanged.
 */
#include <vector>

#include "register/op_def_registry.h"

namespace ops {
namespace {
// Dtype combination i of the op is entry i of every tensor's list.
const std::vector<ge::DataType> GRAD_FLOAT_DTYPES = {ge::DT_FLOAT16, ge::DT_BF16, ge::DT_FLOAT};
const std::vector<ge::DataType> GRAD_FP32_DTYPES = {ge::DT_FLOAT, ge::DT_FLOAT, ge::DT_FLOAT};
const std::vector<ge::Format> GRAD_ND_FORMATS = {ge::FORMAT_ND, ge::FORMAT_ND, ge::FORMAT_ND};

void DeclareND(OpParamDef &param, const std::vector<ge::DataType> &dtypes)
{
    param.ParamType(REQUIRED).DataType(dtypes).Format(GRAD_ND_FORMATS).UnknownShapeFormat(GRAD_ND_FORMATS);
}

OpAICoreConfig GradAICoreConfig(const char *kernelFile)
{
    OpAICoreConfig config;
    config.DynamicCompileStaticFlag(true)
        .DynamicFormatFlag(false)
        .DynamicRankSupportFlag(true)
        .DynamicShapeSupportFlag(true)
        .NeedCheckSupportFlag(false)
        .PrecisionReduceFlag(true)
        .ExtendCfgInfo("opFile.value", kernelFile);
    return config;
}
}  // namespace

class BlockAttentionResidualsGrad : public OpDef {
public:
    explicit BlockAttentionResidualsGrad(const char *name) : OpDef(name)
    {
        for (const char *input : {"partial_block", "block_res", "proj_weight", "norm_weight", "grad_hidden_states"}) {
            DeclareND(this->Input(input), GRAD_FLOAT_DTYPES);
        }
        DeclareND(this->Input("inv_norm"), GRAD_FP32_DTYPES);
        DeclareND(this->Input("probs"), GRAD_FP32_DTYPES);
        // Reserved: kept for interface compatibility; the kernels do not read it.
        this->Attr("valid_block_num").AttrType(OPTIONAL).Int(0);
        for (const char *output : {"grad_partial_block", "grad_block_res", "grad_proj_weight", "grad_norm_weight"}) {
            DeclareND(this->Output(output), GRAD_FLOAT_DTYPES);
        }

        // Kernel entry files: block_attention_residuals_grad (910B / 910_93), _apt (ascend950 regbase).
        OpAICoreConfig arch22 = GradAICoreConfig("block_attention_residuals_grad");
        this->AICore().AddConfig("ascend910b", arch22);
        this->AICore().AddConfig("ascend910_93", arch22);
        OpAICoreConfig regbase = GradAICoreConfig("block_attention_residuals_grad_apt");
        this->AICore().AddConfig("ascend950", regbase);
    }
};

OP_ADD(BlockAttentionResidualsGrad);
}  // namespace ops
