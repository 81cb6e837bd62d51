// The ops of the native kernels: the one list a new op joins (its launch header here, its
// NativeOp in native_ops()). Everything else iterates it.

#pragma once

#include <vector>

#include "block_attention_residuals_grad_launch.h"
#include "block_attention_residuals_launch.h"

namespace attnres {

inline const std::vector<NativeOp>& native_ops() {
  static const std::vector<NativeOp> ops{block_attention_residuals_native_op(),
                                         block_attention_residuals_grad_native_op()};
  return ops;
}

}  // namespace attnres
