// ScaledAdd, the toy op of tests/test_third_op.py (z = x + alpha * y on [T, H] float32): its tiling
// record, kernel arguments and launch record, laid out as each op's launch header is.

#ifndef ATTNRES_SCALED_ADD_LAUNCH_H
#define ATTNRES_SCALED_ADD_LAUNCH_H

#include "launch_record.h"

namespace attnres {

// op_host's ScaledAddTilingData.to_bytes(): tokens and hidden int64, alpha float32.
struct ScaledAddTilingData {
  int64_t tokens, hidden;
  float alpha;
};
constexpr size_t kScaledAddRecordBytes = offsetof(ScaledAddTilingData, alpha) + sizeof(float);

struct ScaledAddArgs : ScaledAddTilingData {
  const float* x;
  const float* y;
  float* z;
};

void scaled_add(const ScaledAddArgs& args, int max_threads);

inline void run_kernel(const ScaledAddArgs& record, const void* const* inputs, void* const* outputs, void*,
                       int max_threads) {
  ScaledAddArgs args = record;
  args.x = static_cast<const float*>(inputs[0]);
  args.y = static_cast<const float*>(inputs[1]);
  args.z = static_cast<float*>(outputs[0]);
  scaled_add(args, max_threads);
}

inline int64_t bytes_moved(const ScaledAddArgs& args) { return 3 * 4 * args.tokens * args.hidden; }

inline std::unique_ptr<LaunchRecord> make_scaled_add_launch(const void* bytes, DType, int64_t, std::string*) {
  ScaledAddArgs args{};
  std::memcpy(static_cast<void*>(static_cast<ScaledAddTilingData*>(&args)), bytes, kScaledAddRecordBytes);
  return std::make_unique<KernelLaunch<ScaledAddArgs>>(args);
}

inline NativeOp scaled_add_native_op() {
  using R = ScaledAddTilingData;
  return {"ScaledAdd",
          kScaledAddRecordBytes,
          {ATTNRES_RECORD_FIELD(R, tokens), ATTNRES_RECORD_FIELD(R, hidden), ATTNRES_RECORD_FIELD(R, alpha)},
          make_scaled_add_launch};
}

}  // namespace attnres

#endif  // ATTNRES_SCALED_ADD_LAUNCH_H

// Its entry in the list of native ops (native_op_list.h says how the list is read).
#ifdef ATTNRES_NATIVE_OP
ATTNRES_NATIVE_OP(scaled_add, scaled_add_kernel, ScaledAddArgs, scaled_add_native_op)
#endif
#ifdef ATTNRES_KERNELS_OF_ISA
#include "scaled_add_kernel.h"
#endif
