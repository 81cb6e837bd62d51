// The ops of the native kernels, one line each: the one list a new op joins. Deliberately without an
// include guard: it is read several times, each time for something else, and each op's launch header
// (`<op>_launch.h`: its tiling record, kernel arguments, launch record and NativeOp) ends with its entry:
//
//   included plainly                      the launch headers' declarations (native_ops.h does this)
//   with ATTNRES_NATIVE_OP(entry, kernel, Args, native_op) defined
//                                         that macro once per op: `entry` the dispatched kernel, declared in
//                                         the launch header; `kernel` its name in each instruction set's
//                                         namespace; `Args` its arguments; `native_op()` the op's NativeOp
//   with ATTNRES_DIRECT_KERNEL(entry, kernel, Args) defined
//                                         that macro once per kernel the bindings call directly, with its
//                                         arguments rather than a launch record (an op without a tiling
//                                         record: block_attn_res_read_args.h); `entry`, `kernel`, `Args` as above
//   with ATTNRES_KERNELS_OF_ISA defined, inside an instruction set's namespace (isa_*.cpp)
//                                         each op's kernel header, compiled for that instruction set
//
// The order is the order of native_ops() and of the kernel headers (a later one may use an earlier one's).

#include "block_attention_residuals_launch.h"
#include "block_attention_residuals_grad_launch.h"
#include "block_attn_res_prepare_launch.h"
#include "block_attn_res_update_launch.h"
#include "block_attn_res_read_args.h"
