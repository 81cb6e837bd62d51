/*!
 * \file block_attn_res_update_def.cpp
 * \brief OpDef of BlockAttnResUpdate: the inputs, outputs, dtypes, formats, attribute and AICore config of
 *        hicann/ops-transformer attention/block_attn_res_update (as staged in shared/cann-src/upstream/two-phase,
 *        recursion-ascend/ops-transformer@a093e95), so a package holding it runs CANN's kernel of that op unchanged.
 *        Output partial_block has the name of input partial_block: GE reads that as a reference tensor (the
 *        input's memory, updated in place). delta and h are bfloat16, everything else float32.
 */
#include "register/op_def_registry.h"

namespace ops {
namespace {
constexpr float DEFAULT_EPS = 1e-6F;
constexpr const char *KERNEL_OP_FILE = "block_attn_res_update";  // CANN's ascend950 kernel entry

// One dtype, ND, contiguous: CANN declares every tensor of this op with Format (not FormatList).
void DeclareND(OpParamDef &param, ge::DataType dtype)
{
    param.ParamType(REQUIRED).DataType({dtype}).Format({ge::FORMAT_ND}).AutoContiguous();
}

OpAICoreConfig Ascend950Config()
{
    OpAICoreConfig config;
    config.DynamicCompileStaticFlag(true)
        .DynamicFormatFlag(false)
        .DynamicRankSupportFlag(true)
        .DynamicShapeSupportFlag(true)
        .NeedCheckSupportFlag(false)
        .PrecisionReduceFlag(true)
        .ExtendCfgInfo("opFile.value", KERNEL_OP_FILE);
    return config;
}
}  // namespace

class BlockAttnResUpdate : public OpDef {
public:
    explicit BlockAttnResUpdate(const char *name) : OpDef(name)
    {
        DeclareND(this->Input("partial_block"), ge::DT_FLOAT);
        DeclareND(this->Input("delta"), ge::DT_BF16);
        for (const char *input : {"pseudo_query", "numerator", "logit_max", "exp_sum"}) {
            DeclareND(this->Input(input), ge::DT_FLOAT);
        }
        DeclareND(this->Output("partial_block"), ge::DT_FLOAT);  // the reference output
        DeclareND(this->Output("h"), ge::DT_BF16);
        this->Attr("eps").AttrType(OPTIONAL).Float(DEFAULT_EPS);
        OpAICoreConfig ascend950 = Ascend950Config();
        this->AICore().AddConfig("ascend950", ascend950);
    }
};

OP_ADD(BlockAttnResUpdate);
}  // namespace ops
