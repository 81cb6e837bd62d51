// Run-time choice of the kernels' instruction set (dispatch.h), and the kernels' entry
// points that go through it (declared in each op's launch header; the list of ops is native_op_list.h).

#include "dispatch.h"

#include <atomic>

#include "native_ops.h"

#if defined(__x86_64__) || defined(__i386__)
#define ATTNRES_X86 1
#else
#define ATTNRES_X86 0
#endif

namespace attnres {

// The kernel table of each instruction set (isa_*.cpp): a pointer per op's kernel and per directly
// called kernel, in the list's order.
struct KernelTable {
#define ATTNRES_NATIVE_OP(entry, kernel, Args, native_op) void (*kernel)(const Args&, int max_threads);
#define ATTNRES_DIRECT_KERNEL(entry, kernel, Args) void (*kernel)(const Args&, int max_threads);
#include "native_op_list.h"
#undef ATTNRES_NATIVE_OP
#undef ATTNRES_DIRECT_KERNEL
};

// The kernels of each instruction set, declared here only (a declaration seen before an
// isa_*.cpp target pragma would make the compiler treat the definition as a second,
// target-specific version of the function), and the instruction set's table.
#define ATTNRES_ISA scalar
#include "isa_kernel_table.h"
#undef ATTNRES_ISA
#if ATTNRES_X86
#define ATTNRES_ISA avx2
#include "isa_kernel_table.h"
#undef ATTNRES_ISA
#define ATTNRES_ISA avx512
#include "isa_kernel_table.h"
#undef ATTNRES_ISA
#define ATTNRES_ISA avx512bf16
#include "isa_kernel_table.h"
#undef ATTNRES_ISA
#endif

namespace {

struct IsaPath {
  const char* name;
  bool (*supported)();
  const KernelTable& kernels;
};

bool always() { return true; }

void cpu_init() {
#if ATTNRES_X86
  __builtin_cpu_init();
#endif
}

#if ATTNRES_X86
// __builtin_cpu_supports reads CPUID and also checks that the OS saves the vector
// registers (XGETBV), so a feature it reports can be used.
bool has_avx2() {
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
}
bool has_avx512() {
  return has_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl");
}
bool has_avx512bf16() {
  return has_avx512() && __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512bf16");
}
#endif

const IsaPath kPaths[] = {
    {"scalar", always, scalar::kKernels},
#if ATTNRES_X86
    {"avx2", has_avx2, avx2::kKernels},
    {"avx512", has_avx512, avx512::kKernels},
    {"avx512bf16", has_avx512bf16, avx512bf16::kKernels},
#endif
};

const IsaPath* best_path() {
  cpu_init();
  const IsaPath* best = &kPaths[0];
  for (const IsaPath& path : kPaths) {
    if (path.supported()) best = &path;
  }
  return best;
}

std::atomic<const IsaPath*>& selected() {
  static std::atomic<const IsaPath*> path{best_path()};
  return path;
}

}  // namespace

std::vector<std::string> known_isa_paths() {
  std::vector<std::string> names;
  for (const IsaPath& path : kPaths) names.emplace_back(path.name);
  return names;
}

std::vector<std::string> available_isa_paths() {
  cpu_init();
  std::vector<std::string> names;
  for (const IsaPath& path : kPaths) {
    if (path.supported()) names.emplace_back(path.name);
  }
  return names;
}

std::string isa_path() { return selected().load()->name; }

std::string select_isa_path(const std::string& name) {
  cpu_init();
  for (const IsaPath& path : kPaths) {
    if (name != path.name) continue;
    if (!path.supported()) return "this CPU cannot run the " + name + " path";
    selected().store(&path);
    return "";
  }
  return "unknown path " + name;
}

// The dispatched entries: each op's kernel on the selected instruction set.
#define ATTNRES_NATIVE_OP(entry, kernel, Args, native_op) \
  void entry(const Args& args, int max_threads) { selected().load()->kernels.kernel(args, max_threads); }
#define ATTNRES_DIRECT_KERNEL(entry, kernel, Args) ATTNRES_NATIVE_OP(entry, kernel, Args, unused)
#include "native_op_list.h"
#undef ATTNRES_NATIVE_OP
#undef ATTNRES_DIRECT_KERNEL

}  // namespace attnres
