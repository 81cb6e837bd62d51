// The kernels for any CPU (the baseline instruction set): attnres::scalar::forward/backward.

#include "isa_common.h"

namespace attnres {
namespace scalar {
#include "simd_scalar.h"
#include "kernel_loops.h"
#include "op_kernels.h"
}  // namespace scalar
}  // namespace attnres
