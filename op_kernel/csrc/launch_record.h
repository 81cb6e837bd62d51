// Launch records: one op's kernel arguments for one tiling, checked once, without data pointers.
//
// The bindings module (_native) makes one from the bytes of a tiling record (op_host's
// TilingRecord.to_bytes(), which is the op's record struct field for field) and hands it out in
// a capsule named kLaunchRecordCapsule; the torch ops' C++ entry (ge_plugin/csrc) keeps copies.
// Whoever runs one needs not know which op it belongs to: run() binds the data pointers in the
// prototype's order and calls that op's kernel. Each op adds its record struct, its kernel
// arguments and a NativeOp (see block_attention_residuals_launch.h); the list of ops is
// native_op_list.h.

#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "attnres_native.h"
#include "openmp_team.h"

namespace attnres {

constexpr const char* kLaunchRecordCapsule = "attnres_ge.LaunchRecord";

class LaunchRecord {
 public:
  virtual ~LaunchRecord() = default;
  virtual std::unique_ptr<LaunchRecord> clone() const = 0;
  // Runs the op's kernel. inputs and outputs: data pointers in the prototype's order, null for an
  // empty tensor (the forward's statistics when they are not kept); workspace: null when the plan
  // has none. The buffers must have the sizes the record was made for: nothing is checked here.
  virtual void run(const void* const* inputs, void* const* outputs, void* workspace, int max_threads) const = 0;
};

// A launch record of kernel arguments `Args`: run() calls the op's `run_kernel(args, inputs,
// outputs, workspace, max_threads)` (found by argument-dependent lookup), which binds the
// pointers and calls the kernel, on torch's OpenMP team when the call is long (openmp_team.h):
// the op's `bytes_moved(args)` says how long.
template <class Args>
class KernelLaunch final : public LaunchRecord {
 public:
  explicit KernelLaunch(const Args& args) : args_(args) {}
  std::unique_ptr<LaunchRecord> clone() const override { return std::make_unique<KernelLaunch>(args_); }
  void run(const void* const* inputs, void* const* outputs, void* workspace, int max_threads) const override {
    const TorchTeamScope team(bytes_moved(args_), max_threads);
    run_kernel(args_, inputs, outputs, workspace, max_threads);
  }
  const Args& args() const { return args_; }

 private:
  Args args_;
};

// One field of a tiling record struct, as op_kernel/native.py compares it with the dataclass.
struct RecordField {
  const char* name;
  size_t offset;
  size_t size;
};
#define ATTNRES_RECORD_FIELD(Record, field) \
  ::attnres::RecordField { #field, offsetof(Record, field), sizeof(Record::field) }

// What the bindings know of one op: its tiling record's layout and how to make its launch records.
struct NativeOp {
  const char* op_type;  // the GE op type
  size_t record_bytes;  // the length of its tiling record's to_bytes()
  std::vector<RecordField> fields;
  // A launch record from `record` (record_bytes bytes) for inputs of `dtype`, streaming stores
  // for outputs of at least stream_min_bytes; null with `problem` set when the record does not
  // deal out its items and tile H exactly (the kernels walk it, so it must).
  std::unique_ptr<LaunchRecord> (*make_launch)(const void* record, DType dtype, int64_t stream_min_bytes,
                                               std::string* problem);
};

// Kernel arguments `Args` (derived from the op's record struct `Record`) from a record's
// to_bytes(): `Record`'s fields lie at the bytes' offsets (each op static_asserts that its struct
// has no padding between fields); the hidden tiles are the record's; the rest is left zero.
template <class Args, class Record>
Args args_from_record(const void* bytes, size_t size) {
  Args args{};
  std::memcpy(static_cast<void*>(static_cast<Record*>(&args)), bytes, size);
  args.tiles = {args.h_tile, args.h_tile_num, args.h_last_tile};
  return args;
}

inline int64_t dtype_bytes(DType dtype) { return dtype == DType::kFloat32 ? 4 : 2; }

// "" when `used` cores, the first `former_num` taking `former_len` items and the rest
// `tail_len`, cover `items` exactly, `tokens_per_loop` is positive and the hidden tiles cover
// `hidden` with starts at multiples of kLanes; else what is wrong.
inline std::string tiling_problem(int64_t items, int64_t hidden, int64_t used, int64_t former_num, int64_t former_len,
                                  int64_t tail_len, int64_t tokens_per_loop, const HiddenTiles& tiles) {
  if (used < 1 || former_num < 0 || former_num > used || former_len < 0 || tail_len < 0) {
    return "bad core split: used_core_num=" + std::to_string(used) + ", former_core_num=" + std::to_string(former_num);
  }
  if (former_num * former_len + (used - former_num) * tail_len != items) {
    return "the core split does not cover " + std::to_string(items) + " items exactly";
  }
  if (tokens_per_loop < 1) return "tokens_per_loop must be >= 1, got " + std::to_string(tokens_per_loop);
  if (tiles.h_tile_num < 1 || tiles.h_last_tile < 1 || tiles.h_last_tile > tiles.h_tile ||
      (tiles.h_tile_num > 1 && tiles.h_tile % kLanes != 0) ||
      (tiles.h_tile_num - 1) * tiles.h_tile + tiles.h_last_tile != hidden) {
    return "hidden tiles h_tile=" + std::to_string(tiles.h_tile) + ", h_tile_num=" + std::to_string(tiles.h_tile_num) +
           ", h_last_tile=" + std::to_string(tiles.h_last_tile) + " do not tile H=" + std::to_string(hidden) +
           " with starts at multiples of " + std::to_string(kLanes);
  }
  return "";
}

}  // namespace attnres
