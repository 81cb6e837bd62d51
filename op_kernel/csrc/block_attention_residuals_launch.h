// BlockAttentionResiduals (the forward): its tiling record, kernel arguments and launch records.

// The declarations once (a guard, not #pragma once: the entry at the end expands on every inclusion).
#ifndef ATTNRES_BLOCK_ATTENTION_RESIDUALS_LAUNCH_H
#define ATTNRES_BLOCK_ATTENTION_RESIDUALS_LAUNCH_H

#include "launch_record.h"

namespace attnres {

// op_host's ForwardTilingData.to_bytes(), field for field (int fields int64, norm_eps float32).
struct ForwardTilingData {
  int64_t tokens, blocks, rows, hidden;
  int64_t used_core_num, former_core_num, former_core_tokens, tail_core_tokens;
  int64_t tokens_per_loop, h_tile, h_tile_num, h_last_tile;
  int64_t need_backward;
  float norm_eps;
};
constexpr size_t kForwardRecordBytes = offsetof(ForwardTilingData, norm_eps) + sizeof(float);
static_assert(kForwardRecordBytes == 13 * sizeof(int64_t) + sizeof(float), "ForwardTilingData has padding");

// The forward kernel's arguments: the record, what the bindings derive from it, the data pointers.
struct ForwardArgs : ForwardTilingData {
  DType dtype;
  HiddenTiles tiles;
  bool stream_stores;         // non-temporal stores for hidden_states (aligned full groups only)
  const void* partial_block;  // [T, H]
  const void* block_res;      // [T, N, H]
  const void* proj_weight;    // [H]
  const void* norm_weight;    // [H]
  void* hidden_states;        // [T, H] out, input dtype
  float* inv_norm;            // [T, N+1] out, or null when need_backward is 0
  float* probs;               // [T, N+1] out, or null when need_backward is 0
};

// The kernel, on the selected instruction set (dispatch.cpp). max_threads: at most this many
// threads run the tiling's tasks, the caller among them.
void block_attention_residuals_forward(const ForwardArgs& args, int max_threads);

inline void run_kernel(const ForwardArgs& record, const void* const* inputs, void* const* outputs, void*,
                       int max_threads) {
  if (record.tokens == 0) return;
  ForwardArgs args = record;
  args.partial_block = inputs[0];
  args.block_res = inputs[1];
  args.proj_weight = inputs[2];
  args.norm_weight = inputs[3];
  args.hidden_states = outputs[0];
  args.inv_norm = static_cast<float*>(outputs[1]);
  args.probs = static_cast<float*>(outputs[2]);
  block_attention_residuals_forward(args, max_threads);
}

// The least the kernel reads and writes: the N+1 value rows in, hidden_states out.
inline int64_t bytes_moved(const ForwardArgs& args) {
  return (args.blocks + 2) * args.tokens * args.hidden * dtype_bytes(args.dtype);
}

inline std::unique_ptr<LaunchRecord> make_forward_launch(const void* bytes, DType dtype, int64_t stream_min_bytes,
                                                         std::string* problem) {
  ForwardArgs args = args_from_record<ForwardArgs, ForwardTilingData>(bytes, kForwardRecordBytes);
  *problem = tiling_problem(args.tokens, args.hidden, args.used_core_num, args.former_core_num,
                            args.former_core_tokens, args.tail_core_tokens, args.tokens_per_loop, args.tiles);
  if (!problem->empty()) return nullptr;
  args.dtype = dtype;
  args.stream_stores = args.tokens * args.hidden * dtype_bytes(dtype) >= stream_min_bytes;
  return std::make_unique<KernelLaunch<ForwardArgs>>(args);
}

inline NativeOp block_attention_residuals_native_op() {
  using R = ForwardTilingData;
  return {"BlockAttentionResiduals",
          kForwardRecordBytes,
          {ATTNRES_RECORD_FIELD(R, tokens), ATTNRES_RECORD_FIELD(R, blocks), ATTNRES_RECORD_FIELD(R, rows),
           ATTNRES_RECORD_FIELD(R, hidden), ATTNRES_RECORD_FIELD(R, used_core_num),
           ATTNRES_RECORD_FIELD(R, former_core_num), ATTNRES_RECORD_FIELD(R, former_core_tokens),
           ATTNRES_RECORD_FIELD(R, tail_core_tokens), ATTNRES_RECORD_FIELD(R, tokens_per_loop),
           ATTNRES_RECORD_FIELD(R, h_tile), ATTNRES_RECORD_FIELD(R, h_tile_num), ATTNRES_RECORD_FIELD(R, h_last_tile),
           ATTNRES_RECORD_FIELD(R, need_backward), ATTNRES_RECORD_FIELD(R, norm_eps)},
          make_forward_launch};
}

}  // namespace attnres

#endif  // ATTNRES_BLOCK_ATTENTION_RESIDUALS_LAUNCH_H

// Its entry in the list of native ops (native_op_list.h says how the list is read).
#ifdef ATTNRES_NATIVE_OP
ATTNRES_NATIVE_OP(block_attention_residuals_forward, forward, ForwardArgs, block_attention_residuals_native_op)
#endif
#ifdef ATTNRES_KERNELS_OF_ISA
#include "forward_kernel.h"
#endif
