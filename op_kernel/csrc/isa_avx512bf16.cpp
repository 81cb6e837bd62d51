// The kernels for AVX2 + FMA + F16C with AVX512-BF16 conversions to bfloat16 (which need
// AVX-512 F, BW, VL and DQ): attnres::avx512bf16::forward/backward. The arithmetic stays on
// 256-bit registers: 512-bit ones did not make the bfloat16 backward faster (docs/kernels.md,
// performance notes). Only what follows the pragma is compiled for those
// instructions (isa_common.h says why); dispatch.cpp calls it only on a CPU that has them.

#include "isa_common.h"

#if ATTNRES_X86
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")
#define ATTNRES_AVX2_BF16 1
namespace attnres {
namespace avx512bf16 {
#include "simd_avx2.h"
#include "kernel_loops.h"
#include "op_kernels.h"
}  // namespace avx512bf16
}  // namespace attnres
#pragma GCC pop_options
#endif
