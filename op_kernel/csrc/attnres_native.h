// Native CPU kernels of Block AttnRes: what the forward and backward translation units share.
//
// Both kernels execute the tiling records made by op_host (ForwardTilingData,
// BackwardTilingData): cores take contiguous token (forward) or chunk (backward)
// ranges by the former/tail split, walk them `tokens_per_loop` tokens at a time
// and cut the hidden dimension into tiles of `h_tile` columns (a multiple of
// LANES = 16).
//
// Why the results have the same bits for every core count and hidden tile:
//  * Every sum over hidden runs in 16 float32 lanes: lane l adds the elements
//    h with h % 16 == l, in increasing h, carried across tiles. Tile starts are
//    multiples of 16, so the lane an element lands in, and the order inside the
//    lane, do not depend on the tile size. The 16 lanes are combined by one
//    fixed tree at the end (lane_sum).
//  * A partial group of 16 (only ever the last one, at h = H) is loaded zero
//    padded and goes through the same vector operations as a full group.
//  * Every elementwise result (weighted sum over rows, input gradients) is a
//    fixed sequence of fused multiply-adds per element, with rows in order.
//  * The backward's sum over tokens goes through per-chunk rows (CHUNK_TOKENS
//    tokens each), added token by token; the chunk rows are summed in chunk
//    order after the parallel region.
//  * Per-token scalar math (norms, softmax, gradient coefficients) is scalar
//    code, the same path for every token.
// The translation units are built with -ffp-contract=off so that the compiler
// never fuses a multiply and an add on its own: every fused operation below is
// an explicit one.
//
// Nothing here (nor in the bindings) includes torch headers: the extension builds
// in seconds. Layout notes: every [H] float32 scratch buffer (score weight, a
// converted grad_hidden_states row, a chunk's weight-gradient row) is zero padded
// to a multiple of 16 and kept in the lane layout of the input dtype (see
// lane_element), so it is read with the same full-group loads as the inputs.

#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define ATTNRES_AVX2 1
#else
#define ATTNRES_AVX2 0
#endif

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

// ---------------------------------------------------------------------------
// V16: the 16 float32 lanes. With AVX2 two 8-wide registers, otherwise an array.
// vfma(a, b, c) is a * b + c; on the AVX2 path with one rounding.

#if ATTNRES_AVX2

struct V16 {
  __m256 lo, hi;
};

inline V16 vzero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
inline V16 vset(float x) { return {_mm256_set1_ps(x), _mm256_set1_ps(x)}; }
inline V16 vfma(V16 a, V16 b, V16 c) { return {_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)}; }
inline V16 vmul(V16 a, V16 b) { return {_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)}; }

// The fixed combining tree: lanes l and l+8, then l and l+4, l and l+2, l and l+1.
inline float lane_sum(V16 v) {
  const __m256 s8 = _mm256_add_ps(v.lo, v.hi);
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  const __m128 s1 = _mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1));
  return _mm_cvtss_f32(s1);
}

inline V16 vload(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }

// bfloat16 is the top half of a float32, so 16 of them in one 256-bit load become
// floats with one operation per 8: `lo` takes the even elements (shifted up), `hi`
// the odd ones (low half masked off). Lane order within a group of 16 is therefore
// 0,2,..,14,1,3,..,15 for bfloat16 (see lane_element); it depends only on h % 16,
// so the lane sums stay independent of the tiling.
inline V16 vload(const BF16* p) {
  const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return {_mm256_castsi256_ps(_mm256_slli_epi32(raw, 16)),
          _mm256_castsi256_ps(_mm256_and_si256(raw, _mm256_set1_epi32(static_cast<int>(0xffff0000u))))};
}

inline V16 vload(const FP16* p) {
  const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return {_mm256_cvtph_ps(_mm256_castsi256_si128(raw)), _mm256_cvtph_ps(_mm256_extracti128_si256(raw, 1))};
}

// float32 -> bfloat16, round to nearest even, NaN -> 0x7fc0, 8 at a time: the 16-bit
// result in the top half of each 32-bit slot (the bottom half is garbage).
inline __m256i bf16_high_bits(__m256 x) {
  const __m256i bits = _mm256_castps_si256(x);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_add_epi32(bits, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff)));
  const __m256 is_nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
  return _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(rounded),
                                              _mm256_castsi256_ps(_mm256_set1_epi32(0x7fc00000)), is_nan));
}

// The inverse of vload(const BF16*): even elements from lo, odd from hi, in memory order.
inline __m256i pack_bf16(V16 v) {
  return _mm256_blend_epi16(_mm256_srli_epi32(bf16_high_bits(v.lo), 16), bf16_high_bits(v.hi), 0xaa);
}

inline __m256i pack_fp16(V16 v) {
  return _mm256_set_m128i(_mm256_cvtps_ph(v.hi, _MM_FROUND_TO_NEAREST_INT),
                          _mm256_cvtps_ph(v.lo, _MM_FROUND_TO_NEAREST_INT));
}

// The element (h % 16) that lane l of a group holds, per element type.
template <typename T>
constexpr int lane_element(int lane) {
  return std::is_same<T, BF16>::value ? (lane < 8 ? 2 * lane : 2 * (lane - 8) + 1) : lane;
}

inline void vstore(float* p, V16 v) {
  _mm256_storeu_ps(p, v.lo);
  _mm256_storeu_ps(p + 8, v.hi);
}
inline void vstore(BF16* p, V16 v) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), pack_bf16(v)); }
inline void vstore(FP16* p, V16 v) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), pack_fp16(v)); }

// Non-temporal stores: the line goes to memory without first being read (no
// read-for-ownership). p must be 32-byte aligned; callers check.
inline void vstream(float* p, V16 v) {
  _mm256_stream_ps(p, v.lo);
  _mm256_stream_ps(p + 8, v.hi);
}
inline void vstream(BF16* p, V16 v) { _mm256_stream_si256(reinterpret_cast<__m256i*>(p), pack_bf16(v)); }
inline void vstream(FP16* p, V16 v) { _mm256_stream_si256(reinterpret_cast<__m256i*>(p), pack_fp16(v)); }
inline void stream_fence() { _mm_sfence(); }

inline void prefetch(const void* p) { _mm_prefetch(static_cast<const char*>(p), _MM_HINT_T0); }

#else  // portable fallback: the same operations lane by lane

struct V16 {
  float l[16];
};

inline V16 vzero() { return V16{}; }
inline V16 vset(float x) {
  V16 r;
  for (int i = 0; i < 16; ++i) r.l[i] = x;
  return r;
}
inline V16 vfma(V16 a, V16 b, V16 c) {
  V16 r;
  for (int i = 0; i < 16; ++i) r.l[i] = a.l[i] * b.l[i] + c.l[i];  // two roundings (fp-contract off)
  return r;
}
inline V16 vmul(V16 a, V16 b) {
  V16 r;
  for (int i = 0; i < 16; ++i) r.l[i] = a.l[i] * b.l[i];
  return r;
}
inline float lane_sum(V16 v) {
  float s[8];
  for (int i = 0; i < 8; ++i) s[i] = v.l[i] + v.l[i + 8];
  for (int i = 0; i < 4; ++i) s[i] = s[i] + s[i + 4];
  for (int i = 0; i < 2; ++i) s[i] = s[i] + s[i + 2];
  return s[0] + s[1];
}
template <typename T>
inline V16 vload(const T* p) {
  V16 r;
  for (int i = 0; i < 16; ++i) r.l[i] = to_float(p[i]);
  return r;
}
template <typename T>
inline void vstore(T* p, V16 v) {
  for (int i = 0; i < 16; ++i) p[i] = from_float<T>(v.l[i]);
}
template <typename T>
inline void vstream(T* p, V16 v) {
  vstore(p, v);
}
inline void stream_fence() {}
inline void prefetch(const void* p) { __builtin_prefetch(p); }
template <typename T>
constexpr int lane_element(int lane) {
  return lane;
}

#endif

// A group of n < 16 elements (the tail at h = H): zero padded in, first n out.
template <typename T>
inline V16 vload_partial(const T* p, int64_t n) {
  T buf[kLanes];
  std::memset(static_cast<void*>(buf), 0, sizeof buf);  // zero bits are +0.0 in every dtype
  std::memcpy(static_cast<void*>(buf), p, static_cast<size_t>(n) * sizeof(T));
  return vload(buf);
}

template <typename T>
inline void vstore_partial(T* p, V16 v, int64_t n) {
  T buf[kLanes];
  vstore(buf, v);
  std::memcpy(static_cast<void*>(p), buf, static_cast<size_t>(n) * sizeof(T));
}

// ---------------------------------------------------------------------------
// Shared loops.

// Lanes of two sums over hidden [h0, h1) for one row v of one token:
//   x_lanes += v[h] * x[h]   where x is v itself (kSquares) or a shared float row x (the backward's go)
//   y_lanes += v[h] * w[h]   w: the float32 score weight
// x and w are float buffers in the lane layout of T, zero padded to a multiple of 16.
// ahead (elements, 0 for none): each step prefetches v[h + ahead]. The rows of consecutive
// tokens follow one another in memory, so a distance of a few KiB keeps the memory reads of
// this pass in flight while it computes (the hardware prefetcher alone falls behind). A
// prefetch never faults, so running past the end of a row or buffer is harmless.
template <bool kSquares, typename T>
inline void dot_lanes_1(const T* v, const float* x, const float* w, int64_t h0, int64_t h1, V16& x_lanes,
                        V16& y_lanes, int64_t ahead = 0) {
  V16 xs = x_lanes, ys = y_lanes;  // locals, so that they stay in registers
  int64_t h = h0;
  for (; h + kLanes <= h1; h += kLanes) {
    if (ahead != 0) prefetch(v + h + ahead);
    const V16 value = vload(v + h);
    xs = vfma(value, kSquares ? value : vload(x + h), xs);
    ys = vfma(value, vload(w + h), ys);
  }
  if (h < h1) {  // the last, partial group (h1 == H), zero padded
    const V16 value = vload_partial(v + h, h1 - h);
    xs = vfma(value, kSquares ? value : vload(x + h), xs);
    ys = vfma(value, vload(w + h), ys);
  }
  x_lanes = xs;
  y_lanes = ys;
}

// The same for two rows a and b at once: 8 independent chains of fused multiply-adds
// instead of 4. Each row's lanes see exactly the operations dot_lanes_1 would apply.
template <bool kSquares, typename T>
inline void dot_lanes_2(const T* a, const T* b, const float* x, const float* w, int64_t h0, int64_t h1, V16& xa,
                        V16& ya, V16& xb, V16& yb, int64_t ahead = 0) {
  V16 xa_ = xa, ya_ = ya, xb_ = xb, yb_ = yb;
  int64_t h = h0;
  for (; h + kLanes <= h1; h += kLanes) {
    if (ahead != 0) {
      prefetch(a + h + ahead);
      prefetch(b + h + ahead);
    }
    const V16 va = vload(a + h), vb = vload(b + h), wv = vload(w + h);
    V16 xv;
    if (!kSquares) xv = vload(x + h);
    xa_ = vfma(va, kSquares ? va : xv, xa_);
    ya_ = vfma(va, wv, ya_);
    xb_ = vfma(vb, kSquares ? vb : xv, xb_);
    yb_ = vfma(vb, wv, yb_);
  }
  xa = xa_;
  ya = ya_;
  xb = xb_;
  yb = yb_;
  if (h < h1) {
    dot_lanes_1<kSquares>(a, x, w, h, h1, xa, ya);
    dot_lanes_1<kSquares>(b, x, w, h, h1, xb, yb);
  }
}

// All rows of one token over [h0, h1), two rows at a time.
template <bool kSquares, typename T>
inline void dot_lanes_rows(const T* const* rows, int64_t row_num, const float* x, const float* w, int64_t h0,
                           int64_t h1, V16* x_lanes, V16* y_lanes, int64_t ahead = 0) {
  int64_t i = 0;
  for (; i + 2 <= row_num; i += 2) {
    dot_lanes_2<kSquares>(rows[i], rows[i + 1], x, w, h0, h1, x_lanes[i], y_lanes[i], x_lanes[i + 1],
                          y_lanes[i + 1], ahead);
  }
  if (i < row_num) dot_lanes_1<kSquares>(rows[i], x, w, h0, h1, x_lanes[i], y_lanes[i], ahead);
}

inline int64_t padded_hidden(int64_t hidden) { return (hidden + kLanes - 1) / kLanes * kLanes; }

// A row of T as float32 in the lane layout of T, zero padded: [H_pad]
template <typename T>
inline void to_lane_layout(const T* row, int64_t hidden, float* out) {
  int64_t h = 0;
  for (; h + kLanes <= hidden; h += kLanes) vstore(out + h, vload(row + h));
  if (h < hidden) vstore(out + h, vload_partial(row + h, hidden - h));
}

// w[h] = norm_weight[h] * proj_weight[h] rounded to float32, in the lane layout of T, zero padded: [H_pad]
template <typename T>
inline void score_weight(const T* norm_weight, const T* proj_weight, int64_t hidden, float* w) {
  int64_t h = 0;
  for (; h + kLanes <= hidden; h += kLanes) vstore(w + h, vmul(vload(norm_weight + h), vload(proj_weight + h)));
  if (h < hidden) {
    vstore(w + h, vmul(vload_partial(norm_weight + h, hidden - h), vload_partial(proj_weight + h, hidden - h)));
  }
}

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

// A float scratch row [floats] placed at `phase_bytes` (a multiple of 64) from `reference`
// modulo 4 KiB. A load whose address shares its low 12 bits with an earlier store still in
// flight waits for that store ("4K aliasing"). The backward's pass 2 loads its scratch rows
// (go, w, the chunk row) at the same h as it stores the gradient rows, so scratch that happens
// to sit at the gradient rows' page offset makes every such load wait: measured 2.5x slower
// with streaming stores and about 10% with plain ones, depending only on where malloc put it.
class PhasedRow {
 public:
  PhasedRow(int64_t floats, const void* reference, int64_t phase_bytes) : storage_(floats + kPage / 4) {
    const uintptr_t base = reinterpret_cast<uintptr_t>(storage_.data());
    const uintptr_t target = (reinterpret_cast<uintptr_t>(reference) / 64 * 64 + phase_bytes) % kPage;
    data_ = reinterpret_cast<float*>(base + (target + kPage - base % kPage) % kPage);
  }
  float* data() { return data_; }

 private:
  static constexpr uintptr_t kPage = 4096;
  std::vector<float> storage_;
  float* data_;
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

struct ForwardArgs {
  DType dtype;
  const void* partial_block;  // [T, H]
  const void* block_res;      // [T, N, H]
  const void* proj_weight;    // [H]
  const void* norm_weight;    // [H]
  void* hidden_states;        // [T, H] out, input dtype
  float* inv_norm;            // [T, N+1] out, or null when need_backward is 0
  float* probs;               // [T, N+1] out, or null when need_backward is 0
  // ForwardTilingData
  int64_t tokens, blocks, hidden;
  int64_t used_core_num, former_core_num, former_core_tokens, tail_core_tokens;
  int64_t tokens_per_loop;
  HiddenTiles tiles;
  float norm_eps;
  bool stream_stores;  // non-temporal stores for hidden_states (aligned full groups only)
};

struct BackwardArgs {
  DType dtype;
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
  // BackwardTilingData
  int64_t tokens, blocks, hidden;
  int64_t used_core_num, former_core_num, former_core_chunks, tail_core_chunks;
  int64_t chunk_tokens, chunk_num, tokens_per_loop;
  HiddenTiles tiles;
  bool stream_stores;  // non-temporal stores for the input gradients (aligned full groups only)
};

void block_attention_residuals_forward(const ForwardArgs& args);
void block_attention_residuals_backward(const BackwardArgs& args);

// What the bindings module (_native) hands out in PyCapsules, to Python and to the torch ops'
// C++ entry (ge_plugin/csrc): a launch record is a ForwardArgs or BackwardArgs whose tiling fields
// the module has checked (they deal out the tokens and tile H exactly), its pointers unset; the
// kernel table gives the kernels themselves.
constexpr const char* kForwardRecordCapsule = "attnres_ge.ForwardArgs";
constexpr const char* kBackwardRecordCapsule = "attnres_ge.BackwardArgs";
constexpr const char* kKernelTableCapsule = "attnres_ge.KernelTable";

struct KernelTable {
  void (*forward)(const ForwardArgs&);
  void (*backward)(const BackwardArgs&);
};

// Whether this build uses the AVX2/FMA/F16C vector path (reported by the module).
inline bool vector_path() { return ATTNRES_AVX2 != 0; }

}  // namespace attnres
