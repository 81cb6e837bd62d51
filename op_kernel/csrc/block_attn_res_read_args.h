// BlockAttnResRead (the general read of Block AttnRes): the arguments of its forward and backward
// kernels, which the bindings call directly with a call's sizes, attributes and data pointers. The
// read has no tiling record: its L sources are separate tensors whose row strides the caller
// chooses, so a call is described by its arguments alone (op_kernel/native.py, read_forward and
// read_backward). The kernels are read_kernel.h.

// The declarations once (a guard, not #pragma once: the entries at the end expand on every inclusion).
#ifndef ATTNRES_BLOCK_ATTN_RES_READ_ARGS_H
#define ATTNRES_BLOCK_ATTN_RES_READ_ARGS_H

#include <cstdint>
#ifdef ATTNRES_TEST_WITHOUT_READ_KERNELS
#include <cstdio>
#include <cstdlib>
#endif

#include "attnres_native.h"

namespace attnres {

// What the forward and the backward share: the sizes, the sources, the weights and the attributes.
// Every float tensor is contiguous float32; sources and gradients are of `dtype`.
struct ReadShape {
  DType dtype;
  int64_t tokens;       // T
  int64_t hidden;       // H
  int64_t rows;         // L, the sources
  int64_t queries;      // S
  int64_t weight_rows;  // W, the output norm weight's rows: 0 (no output norm), 1 (shared) or S
  const void* const* sources;    // [L] of [T, H] rows, row t of source i at sources[i] + t * source_strides[i]
  const int64_t* source_strides;  // [L] row strides, in elements (>= H)
  const float* query;              // [S, H]
  const float* key_weight;         // [H] or null (all ones)
  const float* output_weight;      // [W, H] or null (no output norm)
  float eps, output_eps, scale;    // GE's float32 attributes
  bool normalize_values;           // mix x_i * r_i rather than x_i

  const void* source_row(int64_t i, int64_t t) const {
    return static_cast<const char*>(sources[i]) + t * source_strides[i] * (dtype == DType::kFloat32 ? 4 : 2);
  }
  bool output_norm() const { return weight_rows > 0; }
};

struct ReadForwardArgs : ReadShape {
  bool stream_stores;     // the output is large enough for streaming stores (aligned full groups only)
  void* out;              // [S, T, H] of dtype
  float* inv_norm;        // [T, L] or null
  float* probs;           // [S, T, L] or null
  float* output_inv_rms;  // [S, T] or null
};

struct ReadBackwardArgs : ReadShape {
  const void* grad_out;          // [S, T, H] of dtype
  const float* inv_norm;         // [T, L]
  const float* probs;            // [S, T, L]
  const float* output_inv_rms;   // [S, T], or null without an output norm
  void* const* grad_sources;     // [L] of contiguous [T, H] of dtype
  float* grad_query;             // [S, H]
  float* grad_key_weight;        // [H] or null (no key weight)
  float* grad_output_weight;     // [W, H] or null (no output norm)
};

// Tokens per task and per weight-gradient workspace row: the backward's sums over tokens go through one
// row per 64-token chunk, summed in chunk order, so they have the same bits for any thread split.
constexpr int64_t kReadChunkTokens = 64;

// The least each kernel reads and writes (the size that sends a call to torch's OpenMP team,
// openmp_team.h): the forward reads the L sources and writes S outputs, the backward also reads S output
// gradients and writes L source gradients.
inline int64_t bytes_moved(const ReadForwardArgs& a) {
  return (a.rows + a.queries) * a.tokens * a.hidden * (a.dtype == DType::kFloat32 ? 4 : 2);
}
inline int64_t bytes_moved(const ReadBackwardArgs& a) {
  return (2 * a.rows + a.queries) * a.tokens * a.hidden * (a.dtype == DType::kFloat32 ? 4 : 2);
}

// The kernels, on the selected instruction set (dispatch.cpp); at most max_threads threads, the caller
// among them.
void block_attn_res_read_forward(const ReadForwardArgs& args, int max_threads);
void block_attn_res_read_backward(const ReadBackwardArgs& args, int max_threads);

#ifdef ATTNRES_TEST_WITHOUT_READ_KERNELS
// What the placeholder kernels below call: a test build that left the read's kernels out was asked to run one.
[[noreturn]] inline void read_kernels_left_out() {
  std::fputs("attnres: BlockAttnResRead's kernels were left out of this build (ATTNRES_TEST_WITHOUT_READ_KERNELS)\n",
             stderr);
  std::abort();
}
#endif

}  // namespace attnres

#endif  // ATTNRES_BLOCK_ATTN_RES_READ_ARGS_H

// Its kernels in the list of directly called kernels (native_op_list.h says how the list is read).
#ifdef ATTNRES_DIRECT_KERNEL
ATTNRES_DIRECT_KERNEL(block_attn_res_read_forward, read_forward, ReadForwardArgs)
ATTNRES_DIRECT_KERNEL(block_attn_res_read_backward, read_backward, ReadBackwardArgs)
#endif
#if defined(ATTNRES_KERNELS_OF_ISA) && !defined(ATTNRES_TEST_WITHOUT_READ_KERNELS)
#include "read_kernel.h"
#elif defined(ATTNRES_KERNELS_OF_ISA)
// Only tests that build the other ops' kernels define ATTNRES_TEST_WITHOUT_READ_KERNELS, never setup.py:
// tests/test_loop_model.py (the other ops' loops in one instruction set's assembly) and tests/test_third_op.py
// (a toy op's native build). The read's kernels check nothing there and doubled those compile times; these
// placeholders keep the kernel tables and the bindings linking.
void read_forward(const ReadForwardArgs&, int) { read_kernels_left_out(); }
void read_backward(const ReadBackwardArgs&, int) { read_kernels_left_out(); }
#endif
