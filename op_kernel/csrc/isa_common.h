// What every isa_*.cpp includes before its target pragma: the library headers and the
// instruction-set-neutral code, so that all of it is compiled for the baseline
// instruction set. Inline and template functions of these headers (std::vector's, say)
// are emitted in several translation units and the linker keeps one copy: had one been
// compiled after an AVX-512 pragma, the kept copy could be that one, and the baseline
// path would then run AVX-512 instructions. Only the code after the pragma, which lives
// in the instruction set's own namespace, is compiled for that instruction set.

#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define ATTNRES_X86 1
#else
#define ATTNRES_X86 0
#endif

#include "native_ops.h"
#include "thread_pool.h"
