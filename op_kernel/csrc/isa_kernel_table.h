// One instruction set's kernels and their table, for dispatch.cpp, which includes this once per
// instruction set with ATTNRES_ISA defined as its namespace. Deliberately without an include guard.

namespace ATTNRES_ISA {
#define ATTNRES_NATIVE_OP(entry, kernel, Args, native_op) void kernel(const Args& args, int max_threads);
#define ATTNRES_DIRECT_KERNEL(entry, kernel, Args) void kernel(const Args& args, int max_threads);
#include "native_op_list.h"
#undef ATTNRES_NATIVE_OP
#undef ATTNRES_DIRECT_KERNEL

const KernelTable kKernels{
#define ATTNRES_NATIVE_OP(entry, kernel, Args, native_op) kernel,
#define ATTNRES_DIRECT_KERNEL(entry, kernel, Args) kernel,
#include "native_op_list.h"
#undef ATTNRES_NATIVE_OP
#undef ATTNRES_DIRECT_KERNEL
};
}  // namespace ATTNRES_ISA
