// BlockAttnResUpdate (phase 2 of the two-phase read): its tiling record, kernel arguments and launch records.

// The declarations once (a guard, not #pragma once: the entry at the end expands on every inclusion).
#ifndef ATTNRES_BLOCK_ATTN_RES_UPDATE_LAUNCH_H
#define ATTNRES_BLOCK_ATTN_RES_UPDATE_LAUNCH_H

#include "launch_record.h"

namespace attnres {

// op_host's UpdateTilingData.to_bytes(), field for field (int fields int64, eps float32).
struct UpdateTilingData {
  int64_t tokens, hidden;
  int64_t used_core_num, former_core_num, former_core_tokens, tail_core_tokens;
  int64_t tokens_per_loop, h_tile, h_tile_num, h_last_tile;
  float eps;
};
constexpr size_t kUpdateRecordBytes = offsetof(UpdateTilingData, eps) + sizeof(float);
static_assert(kUpdateRecordBytes == 10 * sizeof(int64_t) + sizeof(float), "UpdateTilingData has padding");

// The update kernel's arguments: the record, what the bindings derive from it, the data pointers.
// Every tensor is float32 but delta and h, which are `dtype`.
struct UpdateArgs : UpdateTilingData {
  DType dtype;
  HiddenTiles tiles;
  bool stream_stores;          // non-temporal stores for h (aligned full groups only)
  const float* partial_block;  // [T, D]
  const void* delta;           // [T, D]
  const float* pseudo_query;   // [D]
  const float* numerator;      // [T, D]
  const float* logit_max;      // [T]
  const float* exp_sum;        // [T]
  float* partial_out;          // [T, D] out: partial_block + delta; may be partial_block itself
  void* h;                     // [T, D] out
  // BlockAttnResUpdateNorm's output RMSNorm of h (its weight [D], float32; null: none, BlockAttnResUpdate).
  const float* output_weight;
  float output_eps;
};

// The kernel, on the selected instruction set (dispatch.cpp); max_threads as for the forward.
void block_attn_res_update(const UpdateArgs& args, int max_threads);

inline void run_kernel(const UpdateArgs& record, const void* const* inputs, void* const* outputs, void*,
                       int max_threads) {
  if (record.tokens == 0 || record.hidden == 0) return;  // no element to write
  UpdateArgs args = record;
  args.partial_block = static_cast<const float*>(inputs[0]);
  args.delta = inputs[1];
  args.pseudo_query = static_cast<const float*>(inputs[2]);
  args.numerator = static_cast<const float*>(inputs[3]);
  args.logit_max = static_cast<const float*>(inputs[4]);
  args.exp_sum = static_cast<const float*>(inputs[5]);
  args.partial_out = static_cast<float*>(outputs[0]);
  args.h = outputs[1];
  block_attn_res_update(args, max_threads);
}

// The least the kernel reads and writes: partial_block, delta and numerator in, partial_block and h out.
inline int64_t bytes_moved(const UpdateArgs& args) {
  return (3 * static_cast<int64_t>(sizeof(float)) + 2 * dtype_bytes(args.dtype)) * args.tokens * args.hidden;
}

inline std::unique_ptr<LaunchRecord> make_update_launch(const void* bytes, DType dtype, int64_t stream_min_bytes,
                                                        std::string* problem) {
  UpdateArgs args = args_from_record<UpdateArgs, UpdateTilingData>(bytes, kUpdateRecordBytes);
  // D = 0 has no column to tile: only the tokens must be dealt exactly.
  const HiddenTiles tiles = args.hidden == 0 ? HiddenTiles{kLanes, 1, 1} : args.tiles;
  *problem = tiling_problem(args.tokens, args.hidden == 0 ? 1 : args.hidden, args.used_core_num,
                            args.former_core_num, args.former_core_tokens, args.tail_core_tokens,
                            args.tokens_per_loop, tiles);
  if (!problem->empty()) return nullptr;
  args.dtype = dtype;
  args.stream_stores = args.tokens * args.hidden * dtype_bytes(dtype) >= stream_min_bytes;
  return std::make_unique<KernelLaunch<UpdateArgs>>(args);
}

inline NativeOp block_attn_res_update_native_op() {
  using R = UpdateTilingData;
  return {"BlockAttnResUpdate",
          kUpdateRecordBytes,
          {ATTNRES_RECORD_FIELD(R, tokens), ATTNRES_RECORD_FIELD(R, hidden), ATTNRES_RECORD_FIELD(R, used_core_num),
           ATTNRES_RECORD_FIELD(R, former_core_num), ATTNRES_RECORD_FIELD(R, former_core_tokens),
           ATTNRES_RECORD_FIELD(R, tail_core_tokens), ATTNRES_RECORD_FIELD(R, tokens_per_loop),
           ATTNRES_RECORD_FIELD(R, h_tile), ATTNRES_RECORD_FIELD(R, h_tile_num), ATTNRES_RECORD_FIELD(R, h_last_tile),
           ATTNRES_RECORD_FIELD(R, eps)},
          make_update_launch};
}

}  // namespace attnres

#endif  // ATTNRES_BLOCK_ATTN_RES_UPDATE_LAUNCH_H

// Its entry in the list of native ops (native_op_list.h says how the list is read).
#ifdef ATTNRES_NATIVE_OP
ATTNRES_NATIVE_OP(block_attn_res_update, update, UpdateArgs, block_attn_res_update_native_op)
#endif
#ifdef ATTNRES_KERNELS_OF_ISA
#include "update_kernel.h"
#endif
