// The kernels for AVX2 + FMA + F16C: attnres::avx2::forward/backward. Only what follows the
// pragma is compiled for those instructions (isa_common.h says why); dispatch.cpp calls it
// only on a CPU that has them.

#include "isa_common.h"

#if ATTNRES_X86
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
namespace attnres {
namespace avx2 {
#include "simd_avx2.h"
#include "kernel_loops.h"
#define ATTNRES_KERNELS_OF_ISA  // every op's kernel (native_op_list.h)
#include "native_op_list.h"
#undef ATTNRES_KERNELS_OF_ISA
}  // namespace avx2
}  // namespace attnres
#pragma GCC pop_options
#endif
