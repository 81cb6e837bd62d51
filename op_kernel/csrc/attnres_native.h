// Native CPU kernels of Block AttnRes: what every translation unit shares.
//
// Both kernels execute the tiling records made by op_host (ForwardTilingData,
// BackwardTilingData): the tiling's cores become tasks (contiguous token ranges in
// the forward, chunk ranges in the backward) that a thread pool deals to at most the
// caller's thread count; each task walks its range `tokens_per_loop` tokens at a time
// and cuts the hidden dimension into tiles of `h_tile` columns (a multiple of
// LANES = 16).
//
// The kernels are compiled once per instruction set (isa_*.cpp) and chosen at run
// time (dispatch.cpp). Why every instruction set, task count, thread count and hidden
// tile gives the same bits:
//  * Every sum over hidden (each feeds a per-token scalar) runs in 16 float64 lanes
//    (D16): lane l adds the elements
//    h with h % 16 == lane_element<T>(l), in increasing h, carried across tiles. Tile
//    starts are multiples of 16, so the lane an element lands in, and the order inside
//    the lane, do not depend on the tile size (nor do the forward's float32 runs of
//    16-bit inputs, which sit at fixed places of H). The 16 lanes are combined by one fixed
//    tree at the end (lane_sum: l + l+8, then + l+4, + l+2, + l+1), the same tree on
//    every instruction set; since the tree pairs lanes, the lane layout is part of the
//    result and is the same on every instruction set too.
//  * A partial group of 16 (only ever the last one, at h = H) is loaded zero
//    padded and goes through the same vector operations as a full group.
//  * Every multiply-add is an explicit fused one (one rounding) on every instruction
//    set, the scalar one included (fmaf; in float64 lanes, where the product of two
//    float32 values is exact, a multiply then an add); every other operation is a single
//    IEEE operation. The translation units are built with -ffp-contract=off so that the
//    compiler never fuses a multiply and an add on its own.
//  * The backward's sum over tokens goes through per-chunk rows (CHUNK_TOKENS
//    tokens each), added token by token; the chunk rows are summed in chunk
//    order after the parallel part.
//  * Per-token scalar math (norms, softmax, gradient coefficients) is scalar float64
//    code, the same for every token and instruction set; the softmax calls the C
//    library's exp, the same function whatever the instruction set path.
//  * A task's result does not depend on the thread that runs it: tasks share no
//    scratch and write disjoint outputs.
//
// Nothing here (nor in the bindings) includes torch headers: the extension builds
// in seconds. Layout notes: every [H] float32 scratch buffer (score weight, a
// converted grad_hidden_states row, a chunk's weight-gradient row; the float64 rows
// of pass 1 likewise) is zero padded
// to a multiple of 16 and kept in the lane layout of the input dtype (see
// lane_element), so it is read with the same full-group loads as the inputs (the
// backward's pass 2 may keep its rows in a layout of split lines instead: kSplitLines in
// backward_kernel.h).

#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

namespace attnres {

constexpr int64_t kLanes = 16;  // must equal op_host.tiling_base.LANES

// Element types of the 16-bit inputs: raw bits, converted to float32 on load.
struct BF16 {
  uint16_t bits;
};
struct FP16 {
  uint16_t bits;
};

enum class DType : int { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };

// The element (h % 16) that lane l of a group of 16 holds. bfloat16 groups hold the
// even elements in lanes 0-7 and the odd ones in lanes 8-15: a bfloat16 is the top
// half of a float32, so 16 of them become floats with one shift (even) and one mask
// (odd) per 8 lanes, no shuffle. Every instruction set uses this layout.
template <typename T>
constexpr int lane_element(int lane) {
  return std::is_same<T, BF16>::value ? (lane < 8 ? 2 * lane : 2 * (lane - 8) + 1) : lane;
}

// ---------------------------------------------------------------------------
// Scalar conversions (used for weights, tails and the portable fallback).

inline float to_float(float x) { return x; }

inline float to_float(BF16 x) {
  uint32_t bits = static_cast<uint32_t>(x.bits) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

inline float to_float(FP16 x) {
  // IEEE binary16 -> binary32, exact (every half is a float).
  const uint32_t sign = static_cast<uint32_t>(x.bits & 0x8000u) << 16;
  uint32_t exponent = (x.bits >> 10) & 0x1fu;
  uint32_t mantissa = x.bits & 0x3ffu;
  uint32_t bits;
  if (exponent == 0x1f) {  // Inf or NaN
    bits = sign | 0x7f800000u | (mantissa << 13);
  } else if (exponent != 0) {  // normal
    bits = sign | ((exponent + 112u) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {  // signed zero
    bits = sign;
  } else {  // subnormal: normalise
    exponent = 113;
    while ((mantissa & 0x400u) == 0) {
      mantissa <<= 1;
      --exponent;
    }
    bits = sign | (exponent << 23) | ((mantissa & 0x3ffu) << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

template <typename T>
inline T from_float(float x);

template <>
inline float from_float<float>(float x) {
  return x;
}

template <>
inline BF16 from_float<BF16>(float x) {
  // Round to nearest even, NaN to the canonical quiet NaN (as c10::BFloat16 does).
  if (std::isnan(x)) return BF16{0x7fc0};
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return BF16{static_cast<uint16_t>(bits >> 16)};
}

template <>
inline FP16 from_float<FP16>(float x) {
  // binary32 -> binary16, round to nearest even; overflow to Inf; NaN stays NaN.
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t abs = bits & 0x7fffffffu;
  if (abs > 0x7f800000u) return FP16{static_cast<uint16_t>(sign | 0x7e00u)};
  if (abs >= 0x477ff000u) return FP16{static_cast<uint16_t>(sign | 0x7c00u)};  // rounds to >= 65520: Inf
  if (abs < 0x38800000u) {  // below the smallest normal half: subnormal or zero
    if (abs < 0x33000000u) return FP16{sign};  // below half the smallest subnormal
    const uint32_t exponent = abs >> 23;
    const uint32_t mantissa = (abs & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126u - exponent;  // 14 .. 24
    uint32_t half = mantissa >> shift;
    const uint32_t rest = mantissa & ((1u << shift) - 1u);
    const uint32_t halfway = 1u << (shift - 1u);
    if (rest > halfway || (rest == halfway && (half & 1u))) ++half;
    return FP16{static_cast<uint16_t>(sign | half)};
  }
  uint32_t rebased = abs - 0x38000000u;  // exponent bias 127 -> 15
  rebased += 0xfffu + ((rebased >> 13) & 1u);
  return FP16{static_cast<uint16_t>(sign | (rebased >> 13))};
}

// float16 -> float32 as vcvtph2ps does it (the paths without F16C): exact, a signalling NaN comes back quiet.
inline float fp16_lane(FP16 x) {
  float f = to_float(x);
  if (std::isnan(f)) {
    uint32_t bits;
    std::memcpy(&bits, &f, sizeof bits);
    bits |= 0x00400000u;
    std::memcpy(&f, &bits, sizeof f);
  }
  return f;
}

// float32 -> float16 as vcvtps2ph does it: round to nearest even, and a NaN keeps its
// sign and the top bits of its payload (from_float<FP16> makes every NaN 0x7e00).
inline FP16 fp16_pack_lane(float x) {
  if (!std::isnan(x)) return from_float<FP16>(x);
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  return FP16{static_cast<uint16_t>(((bits >> 16) & 0x8000u) | 0x7e00u | ((bits >> 13) & 0x3ffu))};
}

// ---------------------------------------------------------------------------
// Scratch rows (no vector code).

inline int64_t padded_hidden(int64_t hidden) { return (hidden + kLanes - 1) / kLanes * kLanes; }

// A float row [H] in natural order from one in the lane layout of T ([H_pad]).
template <typename T>
inline void from_lane_layout(const float* lanes, int64_t hidden, float* out) {
  for (int64_t group = 0; group < hidden; group += kLanes) {
    for (int lane = 0; lane < kLanes; ++lane) {
      const int64_t h = group + lane_element<T>(lane);
      if (h < hidden) out[h] = lanes[group + lane];
    }
  }
}

// A scratch row [size] of E placed at `phase_bytes` (a multiple of 64) from `reference` modulo
// 4 KiB, so 64-byte aligned: the vector loads of the loops that read it every group never split a
// cache line (malloc aligns to 16 bytes: the float32 kernels ran 3-5% slower from cache so, docs/notes/kernel-variants.md).
// A load whose address shares its low 12 bits with an earlier store still in flight waits for that
// store ("4K aliasing"). The backward's pass 2 loads its scratch rows (go, w, the chunk row) at the
// same h as it stores the gradient rows, so scratch that happens to sit at the gradient rows' page
// offset would make every such load wait, at a cost that depends only on where malloc put it; fixed,
// distinct offsets make it never happen.
template <typename E = float>
class PhasedRow {
 public:
  PhasedRow(int64_t size, const void* reference, int64_t phase_bytes)
      : storage_(size > 0 ? size + kPage / sizeof(E) : 0) {
    if (size == 0) return;  // an empty row reserves nothing; data() is null
    const uintptr_t base = reinterpret_cast<uintptr_t>(storage_.data());
    const uintptr_t target = (reinterpret_cast<uintptr_t>(reference) / 64 * 64 + phase_bytes) % kPage;
    data_ = reinterpret_cast<E*>(base + (target + kPage - base % kPage) % kPage);
  }
  E* data() { return data_; }
  const E* data() const { return data_; }

 private:
  static constexpr uintptr_t kPage = 4096;
  std::vector<E> storage_;
  E* data_ = nullptr;
};

// Streaming stores need 32-byte aligned groups: the base and every row start aligned.
template <typename T>
inline bool can_stream(const void* base, int64_t hidden) {
  return reinterpret_cast<uintptr_t>(base) % 32 == 0 && (hidden * static_cast<int64_t>(sizeof(T))) % 32 == 0;
}

// ---------------------------------------------------------------------------
// The tiling, as the kernels read it.

// [start, stop) of the items dealt to `core`: the first `former_num` take
// `former_len`, the rest `tail_len` (op_kernel/kernel_common.core_range).
inline void core_range(int64_t core, int64_t former_num, int64_t former_len, int64_t tail_len, int64_t* start,
                       int64_t* stop) {
  if (core < former_num) {
    *start = core * former_len;
    *stop = *start + former_len;
  } else {
    *start = former_num * former_len + (core - former_num) * tail_len;
    *stop = *start + tail_len;
  }
}

struct HiddenTiles {
  int64_t h_tile, h_tile_num, h_last_tile;
  int64_t begin(int64_t tile) const { return tile * h_tile; }
  int64_t end(int64_t tile) const { return tile * h_tile + (tile == h_tile_num - 1 ? h_last_tile : h_tile); }
};

// Row i of token t of the value stack: block_res[t, i] for i < N, partial_block[t] for i = N.
template <typename T>
inline const T* value_row(const T* block_res, const T* partial_block, int64_t t, int64_t i, int64_t blocks,
                          int64_t hidden) {
  return i < blocks ? block_res + (t * blocks + i) * hidden : partial_block + t * hidden;
}

}  // namespace attnres
