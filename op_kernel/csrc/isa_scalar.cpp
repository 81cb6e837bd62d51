// The kernels for any CPU (the baseline instruction set; on x86 its SSE2): attnres::scalar::forward/backward.
// ATTNRES_PORTABLE_LANES takes the lanes of other architectures on x86 too (a test compiles them so).

#include "isa_common.h"

namespace attnres {
namespace scalar {
#if defined(__SSE2__) && !defined(ATTNRES_PORTABLE_LANES)
#include "simd_sse2.h"
#else
#include "simd_scalar.h"
#endif
#include "kernel_loops.h"
#define ATTNRES_KERNELS_OF_ISA  // every op's kernel (native_op_list.h)
#include "native_op_list.h"
#undef ATTNRES_KERNELS_OF_ISA
}  // namespace scalar
}  // namespace attnres
