// The ops of the native kernels (their list is native_op_list.h) as the bindings see them: their
// declarations and native_ops(), what the module looks an op type up in. dispatch.cpp builds the
// per-instruction-set tables and the dispatched entries from the same list.

#pragma once

#include <vector>

#include "native_op_list.h"

namespace attnres {

inline const std::vector<NativeOp>& native_ops() {
  static const std::vector<NativeOp> ops{
#define ATTNRES_NATIVE_OP(entry, kernel, Args, native_op) native_op(),
#include "native_op_list.h"
#undef ATTNRES_NATIVE_OP
  };
  return ops;
}

}  // namespace attnres
