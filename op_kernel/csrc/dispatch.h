// Which instruction set the kernels run on: chosen once from what the CPU reports (CPUID),
// changeable by the bindings (ATTNRES_GE_ISA, tests, benchmarks). Every choice gives the
// same bits (attnres_native.h says why).

#pragma once

#include <string>
#include <vector>

namespace attnres {

// Every path this build knows, from the most portable to the fastest:
// "scalar", "avx2", "avx512", "avx512bf16" (only "scalar" off x86).
std::vector<std::string> known_isa_paths();

// The known paths this CPU can run, in the same order.
std::vector<std::string> available_isa_paths();

// The path the kernels run on now (at first: the last of available_isa_paths()).
std::string isa_path();

// Makes the kernels run on `name`; "" on success, else why not (unknown name, or a path
// this CPU cannot run), and nothing changes.
std::string select_isa_path(const std::string& name);

}  // namespace attnres
