// BlockAttentionResidualsGrad (the backward): its tiling record, kernel arguments and launch records.

// The declarations once (a guard, not #pragma once: the entry at the end expands on every inclusion).
#ifndef ATTNRES_BLOCK_ATTENTION_RESIDUALS_GRAD_LAUNCH_H
#define ATTNRES_BLOCK_ATTENTION_RESIDUALS_GRAD_LAUNCH_H

#include "launch_record.h"

namespace attnres {

// op_host's BackwardTilingData.to_bytes(), field for field (every field int64).
struct BackwardTilingData {
  int64_t tokens, blocks, rows, hidden;
  int64_t used_core_num, former_core_num, former_core_chunks, tail_core_chunks;
  int64_t chunk_tokens, chunk_num, tokens_per_loop;
  int64_t h_tile, h_tile_num, h_last_tile;
};
constexpr size_t kBackwardRecordBytes = offsetof(BackwardTilingData, h_last_tile) + sizeof(int64_t);
static_assert(kBackwardRecordBytes == 14 * sizeof(int64_t), "BackwardTilingData has padding");

// The backward kernel's arguments: the record, what the bindings derive from it, the data pointers.
struct BackwardArgs : BackwardTilingData {
  DType dtype;
  HiddenTiles tiles;
  bool stream_stores;              // non-temporal stores for the input gradients (aligned full groups only)
  const void* partial_block;       // [T, H]
  const void* block_res;           // [T, N, H]
  const void* proj_weight;         // [H]
  const void* norm_weight;         // [H]
  const void* grad_hidden_states;  // [T, H]
  const float* inv_norm;           // [T, N+1]
  const float* probs;              // [T, N+1]
  void* grad_partial_block;        // [T, H] out
  void* grad_block_res;            // [T, N, H] out
  void* grad_proj_weight;          // [H] out
  void* grad_norm_weight;          // [H] out
  float* chunk_rows;               // workspace [chunk_num, H] float32
};

// The kernel, on the selected instruction set (dispatch.cpp); max_threads as for the forward.
void block_attention_residuals_backward(const BackwardArgs& args, int max_threads);

inline void run_kernel(const BackwardArgs& record, const void* const* inputs, void* const* outputs, void* workspace,
                       int max_threads) {
  BackwardArgs args = record;
  args.partial_block = inputs[0];
  args.block_res = inputs[1];
  args.proj_weight = inputs[2];
  args.norm_weight = inputs[3];
  args.grad_hidden_states = inputs[4];
  args.inv_norm = static_cast<const float*>(inputs[5]);
  args.probs = static_cast<const float*>(inputs[6]);
  args.grad_partial_block = outputs[0];
  args.grad_block_res = outputs[1];
  args.grad_proj_weight = outputs[2];
  args.grad_norm_weight = outputs[3];
  args.chunk_rows = static_cast<float*>(workspace);
  block_attention_residuals_backward(args, max_threads);
}

// The least the kernel reads and writes: the N+1 value rows and grad_hidden_states in, their
// N+1 gradients out.
inline int64_t bytes_moved(const BackwardArgs& args) {
  return (2 * args.blocks + 3) * args.tokens * args.hidden * dtype_bytes(args.dtype);
}

inline std::unique_ptr<LaunchRecord> make_backward_launch(const void* bytes, DType dtype, int64_t stream_min_bytes,
                                                          std::string* problem) {
  BackwardArgs args = args_from_record<BackwardArgs, BackwardTilingData>(bytes, kBackwardRecordBytes);
  *problem = tiling_problem(args.chunk_num, args.hidden, args.used_core_num, args.former_core_num,
                            args.former_core_chunks, args.tail_core_chunks, args.tokens_per_loop, args.tiles);
  if (problem->empty() && (args.chunk_tokens < 1 || args.chunk_num != (args.tokens + args.chunk_tokens - 1) /
                                                                           args.chunk_tokens)) {
    *problem = "chunk_num " + std::to_string(args.chunk_num) + " does not match " + std::to_string(args.tokens) +
               " tokens in chunks of " + std::to_string(args.chunk_tokens);
  }
  if (!problem->empty()) return nullptr;
  args.dtype = dtype;
  const int64_t output_bytes = (args.blocks + 1) * args.tokens * args.hidden * dtype_bytes(dtype);
  args.stream_stores = output_bytes >= stream_min_bytes;
  return std::make_unique<KernelLaunch<BackwardArgs>>(args);
}

inline NativeOp block_attention_residuals_grad_native_op() {
  using R = BackwardTilingData;
  return {"BlockAttentionResidualsGrad",
          kBackwardRecordBytes,
          {ATTNRES_RECORD_FIELD(R, tokens), ATTNRES_RECORD_FIELD(R, blocks), ATTNRES_RECORD_FIELD(R, rows),
           ATTNRES_RECORD_FIELD(R, hidden), ATTNRES_RECORD_FIELD(R, used_core_num),
           ATTNRES_RECORD_FIELD(R, former_core_num), ATTNRES_RECORD_FIELD(R, former_core_chunks),
           ATTNRES_RECORD_FIELD(R, tail_core_chunks), ATTNRES_RECORD_FIELD(R, chunk_tokens),
           ATTNRES_RECORD_FIELD(R, chunk_num), ATTNRES_RECORD_FIELD(R, tokens_per_loop),
           ATTNRES_RECORD_FIELD(R, h_tile), ATTNRES_RECORD_FIELD(R, h_tile_num),
           ATTNRES_RECORD_FIELD(R, h_last_tile)},
          make_backward_launch};
}

}  // namespace attnres

#endif  // ATTNRES_BLOCK_ATTENTION_RESIDUALS_GRAD_LAUNCH_H

// Its entry in the list of native ops (native_op_list.h says how the list is read).
#ifdef ATTNRES_NATIVE_OP
ATTNRES_NATIVE_OP(block_attention_residuals_backward, backward, BackwardArgs, block_attention_residuals_grad_native_op)
#endif
#ifdef ATTNRES_KERNELS_OF_ISA
#include "backward_kernel.h"
#endif
