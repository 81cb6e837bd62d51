// Every op's kernel, compiled once per instruction set: each isa_*.cpp includes this inside its
// instruction set's namespace, after its SIMD header and kernel_loops.h. A new op adds its
// kernel header here (and its entry to ATTNRES_NATIVE_KERNELS in native_ops.h).

#include "forward_kernel.h"
#include "backward_kernel.h"
#include "prepare_kernel.h"
#include "update_kernel.h"
