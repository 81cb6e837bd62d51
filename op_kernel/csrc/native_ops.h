// The ops of the native kernels: the one list a new op joins (its launch header here, its
// NativeOp in native_ops(), its kernel in ATTNRES_NATIVE_KERNELS; its kernel header in
// op_kernels.h). Everything else iterates them.

#pragma once

#include <vector>

#include "block_attention_residuals_grad_launch.h"
#include "block_attention_residuals_launch.h"
#include "block_attn_res_prepare_launch.h"
#include "block_attn_res_update_launch.h"

// X(dispatched entry, kernel of each instruction set, kernel arguments) for every op: dispatch.cpp
// builds its per-instruction-set tables and the dispatched entries (declared in the launch
// headers) from it.
#define ATTNRES_NATIVE_KERNELS(X)                                 \
  X(block_attention_residuals_forward, forward, ForwardArgs)      \
  X(block_attention_residuals_backward, backward, BackwardArgs)  \
  X(block_attn_res_prepare, prepare, PrepareArgs)                 \
  X(block_attn_res_update, update, UpdateArgs)

namespace attnres {

inline const std::vector<NativeOp>& native_ops() {
  static const std::vector<NativeOp> ops{block_attention_residuals_native_op(),
                                         block_attention_residuals_grad_native_op(),
                                         block_attn_res_prepare_native_op(), block_attn_res_update_native_op()};
  return ops;
}

}  // namespace attnres
