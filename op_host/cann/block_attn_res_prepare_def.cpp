/*!
 * \file block_attn_res_prepare_def.cpp
 * \brief OpDef of BlockAttnResPrepare: the inputs, outputs, dtypes, formats, attribute and AICore config of
 *        hicann/ops-transformer attention/block_attn_res_prepare (as staged in shared/cann-src/upstream/two-phase,
 *        recursion-ascend/ops-transformer@a093e95), so a package holding it runs CANN's kernel of that op unchanged.
 *        One dtype combination: every tensor float32 except valid_blocks (uint64, a count the kernel reads).
 */
#include "register/op_def_registry.h"

namespace ops {
namespace {
constexpr float DEFAULT_EPS = 1e-6F;
constexpr const char *KERNEL_OP_FILE = "block_attn_res_prepare_apt";  // CANN's ascend950 kernel entry

// One dtype, ND, contiguous: CANN declares every tensor of this op with FormatList (one format for all dtypes).
void DeclareND(OpParamDef &param, ge::DataType dtype)
{
    param.ParamType(REQUIRED).DataType({dtype}).FormatList({ge::FORMAT_ND}).AutoContiguous();
}

OpAICoreConfig Ascend950Config()
{
    OpAICoreConfig config;
    config.DynamicCompileStaticFlag(true)
        .DynamicFormatFlag(false)
        .DynamicRankSupportFlag(false)
        .DynamicShapeSupportFlag(true)
        .NeedCheckSupportFlag(false)
        .PrecisionReduceFlag(false)
        .ExtendCfgInfo("opFile.value", KERNEL_OP_FILE);
    return config;
}
}  // namespace

class BlockAttnResPrepare : public OpDef {
public:
    explicit BlockAttnResPrepare(const char *name) : OpDef(name)
    {
        DeclareND(this->Input("block_res"), ge::DT_FLOAT);
        DeclareND(this->Input("valid_blocks"), ge::DT_UINT64);
        DeclareND(this->Input("pseudo_query"), ge::DT_FLOAT);
        for (const char *output : {"numerator", "logit_max", "exp_sum"}) {
            DeclareND(this->Output(output), ge::DT_FLOAT);
        }
        this->Attr("eps").AttrType(OPTIONAL).Float(DEFAULT_EPS);
        OpAICoreConfig ascend950 = Ascend950Config();
        this->AICore().AddConfig("ascend950", ascend950);
    }
};

OP_ADD(BlockAttnResPrepare);
}  // namespace ops
