// BlockAttnResPrepare (phase 1 of the two-phase read): its tiling record, kernel arguments and launch records.

// The declarations once (a guard, not #pragma once: the entry at the end expands on every inclusion).
#ifndef ATTNRES_BLOCK_ATTN_RES_PREPARE_LAUNCH_H
#define ATTNRES_BLOCK_ATTN_RES_PREPARE_LAUNCH_H

#include "launch_record.h"

namespace attnres {

// op_host's PrepareTilingData.to_bytes(), field for field (int fields int64, eps float32).
struct PrepareTilingData {
  int64_t tokens, blocks, queries, hidden;
  int64_t used_core_num, former_core_num, former_core_tokens, tail_core_tokens;
  int64_t tokens_per_loop, query_tile, query_tile_num, query_last_tile;
  int64_t h_tile, h_tile_num, h_last_tile;
  float eps;
};
constexpr size_t kPrepareRecordBytes = offsetof(PrepareTilingData, eps) + sizeof(float);
static_assert(kPrepareRecordBytes == 15 * sizeof(int64_t) + sizeof(float), "PrepareTilingData has padding");

// The prepare kernel's arguments: the record, what the bindings derive from it, the data pointers.
struct PrepareArgs : PrepareTilingData {
  HiddenTiles tiles;
  bool stream_stores;             // non-temporal stores for numerator (aligned full groups only)
  const float* block_res;         // [T, N, D]
  const uint64_t* valid_blocks;   // [1]: the first min(valid_blocks, N) snapshots are read
  const float* pseudo_query;      // [S, D]
  float* numerator;               // [S, T, D] out
  float* logit_max;               // [S, T] out
  float* exp_sum;                 // [S, T] out
};

// The kernel, on the selected instruction set (dispatch.cpp); max_threads as for the forward.
void block_attn_res_prepare(const PrepareArgs& args, int max_threads);

inline void run_kernel(const PrepareArgs& record, const void* const* inputs, void* const* outputs, void*,
                       int max_threads) {
  if (record.tokens == 0 || record.queries == 0) return;
  PrepareArgs args = record;
  args.block_res = static_cast<const float*>(inputs[0]);
  args.valid_blocks = static_cast<const uint64_t*>(inputs[1]);
  args.pseudo_query = static_cast<const float*>(inputs[2]);
  args.numerator = static_cast<float*>(outputs[0]);
  args.logit_max = static_cast<float*>(outputs[1]);
  args.exp_sum = static_cast<float*>(outputs[2]);
  block_attn_res_prepare(args, max_threads);
}

// The least the kernel reads and writes (all N snapshots valid): the snapshots in, the numerators out.
inline int64_t bytes_moved(const PrepareArgs& args) {
  return (args.blocks + args.queries) * args.tokens * args.hidden * static_cast<int64_t>(sizeof(float));
}

// "" when the query groups cover `queries` exactly (a group of queries shares each loaded token).
inline std::string query_tiling_problem(const PrepareTilingData& record) {
  const int64_t tile = record.query_tile, num = record.query_tile_num, last = record.query_last_tile;
  const bool covers = tile >= 1 && num >= 1 && last >= 0 && last <= tile && (num - 1) * tile + last == record.queries &&
                      (last >= 1 || record.queries == 0);
  if (covers) return "";
  return "query groups query_tile=" + std::to_string(tile) + ", query_tile_num=" + std::to_string(num) +
         ", query_last_tile=" + std::to_string(last) + " do not cover S=" + std::to_string(record.queries);
}

inline std::unique_ptr<LaunchRecord> make_prepare_launch(const void* bytes, DType dtype, int64_t stream_min_bytes,
                                                         std::string* problem) {
  PrepareArgs args = args_from_record<PrepareArgs, PrepareTilingData>(bytes, kPrepareRecordBytes);
  if (dtype != DType::kFloat32) {
    *problem = "the snapshots and queries are float32 only";
    return nullptr;
  }
  *problem = tiling_problem(args.tokens, args.hidden, args.used_core_num, args.former_core_num,
                            args.former_core_tokens, args.tail_core_tokens, args.tokens_per_loop, args.tiles);
  if (problem->empty()) *problem = query_tiling_problem(args);
  if (problem->empty() && (args.blocks < 1 || args.queries < 0)) {
    *problem = "N=" + std::to_string(args.blocks) + " and S=" + std::to_string(args.queries) + " must be >= 1 and >= 0";
  }
  if (!problem->empty()) return nullptr;
  const int64_t numerator_bytes = args.queries * args.tokens * args.hidden * static_cast<int64_t>(sizeof(float));
  args.stream_stores = numerator_bytes >= stream_min_bytes;
  return std::make_unique<KernelLaunch<PrepareArgs>>(args);
}

inline NativeOp block_attn_res_prepare_native_op() {
  using R = PrepareTilingData;
  return {"BlockAttnResPrepare",
          kPrepareRecordBytes,
          {ATTNRES_RECORD_FIELD(R, tokens), ATTNRES_RECORD_FIELD(R, blocks), ATTNRES_RECORD_FIELD(R, queries),
           ATTNRES_RECORD_FIELD(R, hidden), ATTNRES_RECORD_FIELD(R, used_core_num),
           ATTNRES_RECORD_FIELD(R, former_core_num), ATTNRES_RECORD_FIELD(R, former_core_tokens),
           ATTNRES_RECORD_FIELD(R, tail_core_tokens), ATTNRES_RECORD_FIELD(R, tokens_per_loop),
           ATTNRES_RECORD_FIELD(R, query_tile), ATTNRES_RECORD_FIELD(R, query_tile_num),
           ATTNRES_RECORD_FIELD(R, query_last_tile), ATTNRES_RECORD_FIELD(R, h_tile),
           ATTNRES_RECORD_FIELD(R, h_tile_num), ATTNRES_RECORD_FIELD(R, h_last_tile), ATTNRES_RECORD_FIELD(R, eps)},
          make_prepare_launch};
}

}  // namespace attnres

#endif  // ATTNRES_BLOCK_ATTN_RES_PREPARE_LAUNCH_H

// Its entry in the list of native ops (native_op_list.h says how the list is read).
#ifdef ATTNRES_NATIVE_OP
ATTNRES_NATIVE_OP(block_attn_res_prepare, prepare, PrepareArgs, block_attn_res_prepare_native_op)
#endif
#ifdef ATTNRES_KERNELS_OF_ISA
#include "prepare_kernel.h"
#endif
