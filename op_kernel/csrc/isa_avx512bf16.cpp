// The kernels for AVX-512 (F, BW, VL) with AVX512-BF16 conversions to bfloat16 (which need
// AVX-512 DQ too): attnres::avx512bf16::forward/backward. The same 512-bit code as the avx512
// path; only the packing of bfloat16 outputs differs (simd_avx512.h). Only what follows the
// pragma is compiled for those instructions (isa_common.h says why); dispatch.cpp calls it
// only on a CPU that has them.

#include "isa_common.h"

#if ATTNRES_X86
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")
#define ATTNRES_AVX512_BF16 1
namespace attnres {
namespace avx512bf16 {
#include "simd_avx512.h"
#include "kernel_loops.h"
#define ATTNRES_KERNELS_OF_ISA  // every op's kernel (native_op_list.h)
#include "native_op_list.h"
#undef ATTNRES_KERNELS_OF_ISA
}  // namespace avx512bf16
}  // namespace attnres
#pragma GCC pop_options
#endif
