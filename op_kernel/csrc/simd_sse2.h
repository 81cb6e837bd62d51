// V16, the 16 float32 lanes, with SSE2 (the baseline of x86-64): four 4-wide registers. Included by
// isa_scalar.cpp inside its namespace on x86 (simd_scalar.h is the same path for other CPUs). Every
// operation gives the bits of simd_scalar.h's and of the vector paths': vfma rounds once like the FMA
// instructions (which SSE2 lacks), lane_sum uses the same tree, bfloat16 uses the same lane layout
// (lane_element) and conversions (NaN to 0x7fc0), float16 converts like F16C (loads by integer
// operations; stores a lane at a time, as SSE2 has no conversion for it). tests/csrc/sse2_check.cpp
// compares every operation with simd_scalar.h's. Every loop over the registers is unrolled: left as
// a loop, GCC keeps a V16 in a stack array.

struct V16 {
  __m128 q[4];  // lanes 0-3, 4-7, 8-11, 12-15
};

inline V16 vzero() { return {{_mm_setzero_ps(), _mm_setzero_ps(), _mm_setzero_ps(), _mm_setzero_ps()}}; }
inline V16 vset(float x) {
  const __m128 v = _mm_set1_ps(x);
  return {{v, v, v, v}};
}

// float32 a * b + c with one rounding, two lanes at a time in float64, where the product of two float32
// values is exact. Rounded to nearest there, the sum s can differ from the exact one x, but a float32
// rounding boundary (the midpoint of two neighbouring floats) is a float64 value, and rounding to
// float64 is monotonic: unless s is such a midpoint, s and x lie on the same side of every boundary and
// round to the same float32. So s is rounded to float32 directly, except in two cases taken by the
// exact route: s is a midpoint of two normal floats (its low 29 bits are 1 followed by 28 zeros), or
// a nonzero s below float32's smallest normal (there the floats are sparser, with other midpoints). The
// exact route rounds the sum to odd instead (rounded to nearest, then, where inexact and even, moved
// one unit toward the exact sum, found by TwoSum), which rounds to the correctly rounded result
// (Boldo and Melquiond, "Emulation of FMA and correctly rounded sums: proved algorithms using
// rounding to odd", 2008). Both need the default floating-point environment (round to nearest, no
// flush to zero, no denormals-are-zero): under any other MXCSR, vfma calls fmaf, which follows the
// environment as the instructions do.
inline __m128d sum_rounded_to_odd(__m128d a, __m128d b, __m128d c) {
  const __m128d product = _mm_mul_pd(a, b);
  const __m128d sum = _mm_add_pd(product, c);
  const __m128d c_part = _mm_sub_pd(sum, product);
  const __m128d error = _mm_add_pd(_mm_sub_pd(product, _mm_sub_pd(sum, c_part)), _mm_sub_pd(c, c_part));
  const __m128i bits = _mm_castpd_si128(sum);
  const __m128i one = _mm_set_epi64x(1, 1);
  const __m128d inexact_and_finite = _mm_and_pd(_mm_cmpneq_pd(error, _mm_setzero_pd()),
                                                _mm_cmplt_pd(_mm_andnot_pd(_mm_set1_pd(-0.0), sum),
                                                             _mm_set1_pd(INFINITY)));
  // SSE2 compares 32-bit integers only: the low half's verdict copied to the high half of each lane.
  const __m128i even = _mm_shuffle_epi32(_mm_cmpeq_epi32(_mm_and_si128(bits, one), _mm_setzero_si128()),
                                         _MM_SHUFFLE(2, 2, 0, 0));
  const __m128i toward_zero = _mm_srli_epi64(_mm_xor_si128(bits, _mm_castpd_si128(error)), 63);  // signs differ
  const __m128i step = _mm_sub_epi64(one, _mm_slli_epi64(toward_zero, 1));                       // +1 or -1
  const __m128i adjust = _mm_and_si128(_mm_and_si128(step, even), _mm_castpd_si128(inexact_and_finite));
  return _mm_castsi128_pd(_mm_add_epi64(bits, adjust));
}

// Four lanes' a, b, c widened: low two lanes, then high two.
struct WideFour {
  __m128d a_low, b_low, c_low, a_high, b_high, c_high;
};
inline WideFour widen_four(__m128 a, __m128 b, __m128 c) {
  return {_mm_cvtps_pd(a), _mm_cvtps_pd(b), _mm_cvtps_pd(c),
          _mm_cvtps_pd(_mm_movehl_ps(a, a)), _mm_cvtps_pd(_mm_movehl_ps(b, b)), _mm_cvtps_pd(_mm_movehl_ps(c, c))};
}

// Bits 0 and 2 of the movemask of the result: lanes of s that need the exact route (above).
inline __m128 needs_exact_route(__m128d s) {
  const __m128i low_bits = _mm_and_si128(_mm_castpd_si128(s), _mm_set1_epi64x(0x1fffffff));
  const __m128i midpoint = _mm_cmpeq_epi32(low_bits, _mm_set1_epi64x(0x10000000));  // valid in the low dwords
  const __m128d magnitude = _mm_andnot_pd(_mm_set1_pd(-0.0), s);
  const __m128d tiny = _mm_and_pd(_mm_cmplt_pd(magnitude, _mm_set1_pd(0x1p-126)), _mm_cmpneq_pd(s, _mm_setzero_pd()));
  return _mm_or_ps(_mm_castsi128_ps(midpoint), _mm_castpd_ps(tiny));
}

inline __m128 fma_four(__m128 a, __m128 b, __m128 c) {
  const WideFour w = widen_four(a, b, c);
  const __m128d low = _mm_add_pd(_mm_mul_pd(w.a_low, w.b_low), w.c_low);
  const __m128d high = _mm_add_pd(_mm_mul_pd(w.a_high, w.b_high), w.c_high);
  constexpr int kLowDwords = 0x5;
  const int exact_lanes = _mm_movemask_ps(_mm_or_ps(needs_exact_route(low), needs_exact_route(high))) & kLowDwords;
  if (__builtin_expect(exact_lanes != 0, 0)) {
    return _mm_movelh_ps(_mm_cvtpd_ps(sum_rounded_to_odd(w.a_low, w.b_low, w.c_low)),
                         _mm_cvtpd_ps(sum_rounded_to_odd(w.a_high, w.b_high, w.c_high)));
  }
  return _mm_movelh_ps(_mm_cvtpd_ps(low), _mm_cvtpd_ps(high));
}

// MXCSR's rounding control, flush-to-zero and denormals-are-zero bits: all clear by default.
constexpr unsigned kNonDefaultMxcsr = 0xe040u;

inline V16 vfma(V16 a, V16 b, V16 c) {
  V16 r;
  if (__builtin_expect((_mm_getcsr() & kNonDefaultMxcsr) == 0, 1)) {
#pragma GCC unroll 8
    for (int i = 0; i < 4; ++i) r.q[i] = fma_four(a.q[i], b.q[i], c.q[i]);
    return r;
  }
  alignas(16) float x[4], y[4], z[4];
#pragma GCC unroll 8
  for (int i = 0; i < 4; ++i) {
    _mm_store_ps(x, a.q[i]);
    _mm_store_ps(y, b.q[i]);
    _mm_store_ps(z, c.q[i]);
    for (int j = 0; j < 4; ++j) x[j] = std::fmaf(x[j], y[j], z[j]);
    r.q[i] = _mm_load_ps(x);
  }
  return r;
}
// a * b + c for lanes whose product is exact in float32 when it is a normal float32 (or zero): the
// products of two 16-bit values and of a bfloat16 with a float32 of at most 16 significant bits
// (kernel_loops.h, add_runs). Where every lane's product is a normal float32 or has a zero operand, the
// product is exact, so one multiply and one add round once as an FMA does; else (a product below the
// smallest normal or beyond the largest float, a NaN) the four lanes take fma_four. The environment
// as for vfma.
inline __m128 fma_four_exact_product(__m128 a, __m128 b, __m128 c) {
  const __m128 product = _mm_mul_ps(a, b);
  const __m128 magnitude = _mm_andnot_ps(_mm_set1_ps(-0.0f), product);
  const __m128 normal = _mm_and_ps(_mm_cmpge_ps(magnitude, _mm_set1_ps(0x1p-126f)),
                                   _mm_cmple_ps(magnitude, _mm_set1_ps(0x1.fffffep127f)));
  const __m128 zero_operand = _mm_or_ps(_mm_cmpeq_ps(a, _mm_setzero_ps()), _mm_cmpeq_ps(b, _mm_setzero_ps()));
  if (__builtin_expect(_mm_movemask_ps(_mm_or_ps(normal, zero_operand)) == 0xf, 1)) return _mm_add_ps(product, c);
  return fma_four(a, b, c);
}

inline V16 vfma_exact_product(V16 a, V16 b, V16 c) {
  if (__builtin_expect((_mm_getcsr() & kNonDefaultMxcsr) == 0, 1)) {
    V16 r;
#pragma GCC unroll 8
    for (int i = 0; i < 4; ++i) r.q[i] = fma_four_exact_product(a.q[i], b.q[i], c.q[i]);
    return r;
  }
  return vfma(a, b, c);
}

inline V16 vmul(V16 a, V16 b) {
  V16 r;
#pragma GCC unroll 8
  for (int i = 0; i < 4; ++i) r.q[i] = _mm_mul_ps(a.q[i], b.q[i]);
  return r;
}

// D16, the same 16 lanes in float64, eight registers of 2 (lanes 0-1, 2-3, .., 14-15): the accumulators
// of the sums over hidden that feed per-token scalars (simd_avx512.h says why).
struct D16 {
  __m128d d[8];
};

inline D16 dzero() {
  D16 r;
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) r.d[i] = _mm_setzero_pd();
  return r;
}
inline D16 widen(V16 v) {
  D16 r;
#pragma GCC unroll 8
  for (int i = 0; i < 4; ++i) {
    r.d[2 * i] = _mm_cvtps_pd(v.q[i]);
    r.d[2 * i + 1] = _mm_cvtps_pd(_mm_movehl_ps(v.q[i], v.q[i]));
  }
  return r;
}
inline D16 dload(const double* p) {
  D16 r;
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) r.d[i] = _mm_loadu_pd(p + 2 * i);
  return r;
}
inline void dstore(double* p, D16 v) {
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) _mm_storeu_pd(p + 2 * i, v.d[i]);
}
// a * b + c. The product of two widened float32 values is exact in float64, so a multiply then an add
// rounds once, like the FMA instructions of the vector paths.
inline D16 dfma(D16 a, D16 b, D16 c) {
  D16 r;
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) r.d[i] = _mm_add_pd(_mm_mul_pd(a.d[i], b.d[i]), c.d[i]);
  return r;
}

// DPart, two of the 16 float64 lanes in one register: what prepare's pass 1 sweeps at a time
// (simd_avx512.h says why).
constexpr int kDotPartLanes = 2;
struct DPart {
  __m128d v;
};
inline DPart dpart_widen(const float* p) {
  return {_mm_cvtps_pd(_mm_castsi128_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))))};
}
inline DPart dpart_load(const double* p) { return {_mm_loadu_pd(p)}; }
inline void dpart_store(double* p, DPart x) { _mm_storeu_pd(p, x.v); }
inline DPart dpart_fma(DPart a, DPart b, DPart c) { return {_mm_add_pd(_mm_mul_pd(a.v, b.v), c.v)}; }  // as dfma

// The fixed combining tree: lanes l and l+8, then l and l+4, l and l+2, l and l+1.
inline double lane_sum(D16 v) {
  __m128d s[4];
#pragma GCC unroll 8
  for (int i = 0; i < 4; ++i) s[i] = _mm_add_pd(v.d[i], v.d[i + 4]);  // lanes 0-7
  const __m128d s4_low = _mm_add_pd(s[0], s[2]), s4_high = _mm_add_pd(s[1], s[3]);  // lanes 0-1, 2-3
  const __m128d s2 = _mm_add_pd(s4_low, s4_high);
  return _mm_cvtsd_f64(_mm_add_sd(s2, _mm_unpackhi_pd(s2, s2)));
}

inline V16 vload(const float* p) {
  V16 r;
#pragma GCC unroll 8
  for (int i = 0; i < 4; ++i) r.q[i] = _mm_loadu_ps(p + 4 * i);
  return r;
}

// bfloat16 in the lane layout of lane_element: each 32-bit word of a load holds an even element (low
// half) and the odd one after it (high half); lanes 0-7 take the even elements (shifted up), 8-15 the
// odd ones (low half masked off).
inline V16 vload(const BF16* p) {
  const __m128i first = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));      // elements 0-7
  const __m128i second = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 8)); // elements 8-15
  const __m128i high_half = _mm_set1_epi32(static_cast<int>(0xffff0000u));
  return {{_mm_castsi128_ps(_mm_slli_epi32(first, 16)), _mm_castsi128_ps(_mm_slli_epi32(second, 16)),
           _mm_castsi128_ps(_mm_and_si128(first, high_half)), _mm_castsi128_ps(_mm_and_si128(second, high_half))}};
}

// The lanes of a bfloat16 group (lane_element) put in element order (lane l = element l), and back:
// what the update kernel needs to add a bfloat16 row to a float32 one.
inline V16 bf16_lanes_in_order(V16 x) {
  return {{_mm_unpacklo_ps(x.q[0], x.q[2]), _mm_unpackhi_ps(x.q[0], x.q[2]), _mm_unpacklo_ps(x.q[1], x.q[3]),
           _mm_unpackhi_ps(x.q[1], x.q[3])}};
}
inline V16 bf16_lanes_from_order(V16 x) {
  constexpr int kEven = _MM_SHUFFLE(2, 0, 2, 0), kOdd = _MM_SHUFFLE(3, 1, 3, 1);
  return {{_mm_shuffle_ps(x.q[0], x.q[1], kEven), _mm_shuffle_ps(x.q[2], x.q[3], kEven),
           _mm_shuffle_ps(x.q[0], x.q[1], kOdd), _mm_shuffle_ps(x.q[2], x.q[3], kOdd)}};
}

// Four float16 values (the low halves of 32-bit words) as vcvtph2ps converts them: exact, a signalling
// NaN comes back quiet. Normal values are rebiased by an integer addition, subnormal ones (m 2^-24, m <
// 2^10) converted from the integer m and scaled, exactly and with normal results, so that neither
// depends on the floating-point environment.
inline __m128 fp16_four(__m128i halves) {
  const __m128i sign = _mm_slli_epi32(_mm_and_si128(halves, _mm_set1_epi32(0x8000)), 16);
  const __m128i magnitude = _mm_and_si128(halves, _mm_set1_epi32(0x7fff));
  const __m128i shifted = _mm_slli_epi32(magnitude, 13);
  const __m128i normal = _mm_add_epi32(shifted, _mm_set1_epi32((127 - 15) << 23));
  const __m128i subnormal = _mm_castps_si128(_mm_mul_ps(_mm_cvtepi32_ps(magnitude), _mm_set1_ps(0x1p-24f)));
  const __m128i is_nan = _mm_cmpgt_epi32(magnitude, _mm_set1_epi32(0x7c00));
  const __m128i special = _mm_or_si128(_mm_or_si128(shifted, _mm_set1_epi32(0x7f800000)),
                                       _mm_and_si128(is_nan, _mm_set1_epi32(0x00400000)));  // Inf, quiet NaN
  const __m128i is_subnormal = _mm_cmplt_epi32(magnitude, _mm_set1_epi32(0x0400));
  const __m128i is_special = _mm_cmpgt_epi32(magnitude, _mm_set1_epi32(0x7bff));
  __m128i bits = _mm_or_si128(_mm_and_si128(is_subnormal, subnormal), _mm_andnot_si128(is_subnormal, normal));
  bits = _mm_or_si128(_mm_and_si128(is_special, special), _mm_andnot_si128(is_special, bits));
  return _mm_castsi128_ps(_mm_or_si128(bits, sign));
}

inline V16 vload(const FP16* p) {
  const __m128i first = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));      // elements 0-7
  const __m128i second = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 8)); // elements 8-15
  const __m128i zero = _mm_setzero_si128();
  return {{fp16_four(_mm_unpacklo_epi16(first, zero)), fp16_four(_mm_unpackhi_epi16(first, zero)),
           fp16_four(_mm_unpacklo_epi16(second, zero)), fp16_four(_mm_unpackhi_epi16(second, zero))}};
}

// float32 -> bfloat16 of four lanes, as from_float<BF16>: round to nearest even, NaN to 0x7fc0; the
// result in the high half of each 32-bit word (the low half is garbage).
inline __m128i bf16_high_bits(__m128 x) {
  const __m128i bits = _mm_castps_si128(x);
  const __m128i lsb = _mm_and_si128(_mm_srli_epi32(bits, 16), _mm_set1_epi32(1));
  const __m128i rounded = _mm_add_epi32(bits, _mm_add_epi32(lsb, _mm_set1_epi32(0x7fff)));
  const __m128i is_nan = _mm_castps_si128(_mm_cmpunord_ps(x, x));
  return _mm_or_si128(_mm_andnot_si128(is_nan, rounded), _mm_and_si128(is_nan, _mm_set1_epi32(0x7fc00000)));
}

// The inverse of vload(const BF16*): word i of each half holds even lane i (its low word) and odd lane
// 8 + i (its high word).
inline void pack_bf16(V16 v, __m128i* first, __m128i* second) {
  const __m128i high_half = _mm_set1_epi32(static_cast<int>(0xffff0000u));
  *first = _mm_or_si128(_mm_srli_epi32(bf16_high_bits(v.q[0]), 16), _mm_and_si128(bf16_high_bits(v.q[2]), high_half));
  *second = _mm_or_si128(_mm_srli_epi32(bf16_high_bits(v.q[1]), 16), _mm_and_si128(bf16_high_bits(v.q[3]), high_half));
}

inline void vstore(float* p, V16 v) {
#pragma GCC unroll 8
  for (int i = 0; i < 4; ++i) _mm_storeu_ps(p + 4 * i, v.q[i]);
}
inline void vstore(BF16* p, V16 v) {
  __m128i first, second;
  pack_bf16(v, &first, &second);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), first);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p + 8), second);
}
inline void vstore(FP16* p, V16 v) {
  alignas(16) float lanes[16];
  vstore(lanes, v);
  for (int lane = 0; lane < 16; ++lane) p[lane] = fp16_pack_lane(lanes[lane]);
}

// Non-temporal stores: the line goes to memory without first being read (no read-for-ownership).
// p must be 16-byte aligned (can_stream asks for 32). float16 groups, converted a lane at a time,
// are stored plainly (the same bits).
inline void vstream(float* p, V16 v) {
#pragma GCC unroll 8
  for (int i = 0; i < 4; ++i) _mm_stream_ps(p + 4 * i, v.q[i]);
}
inline void vstream(BF16* p, V16 v) {
  __m128i first, second;
  pack_bf16(v, &first, &second);
  _mm_stream_si128(reinterpret_cast<__m128i*>(p), first);
  _mm_stream_si128(reinterpret_cast<__m128i*>(p + 8), second);
}
inline void vstream(FP16* p, V16 v) { vstore(p, v); }

inline void stream_fence() { _mm_sfence(); }

inline void prefetch(const void* p) { _mm_prefetch(static_cast<const char*>(p), _MM_HINT_T0); }
// The same into L2 only, for lines needed after this pass rather than within it.
inline void prefetch_l2(const void* p) { _mm_prefetch(static_cast<const char*>(p), _MM_HINT_T1); }

// No split bfloat16 lines (simd_avx512.h): this path's bfloat16 loads are shifts and masks already.
constexpr bool kSplitBf16Lines = false;
// No stores of numbers only (simd_avx2.h): its conversions choose by a mask, without branching.
constexpr bool kBf16NumberStores = false;

// Rows add_runs reads at once (kernel_loops.h): nine; with fewer, fewer memory streams were in flight and
// the SSE2 lanes ran twice as slow (docs/notes/kernel-variants.md).
constexpr int kRunRows = 9;

// Float32 pass 1 walks each group of rows over all of H (kernel_loops.h).
constexpr int64_t kFloat32RowChunk = 0;

// The prepare kernel's register blocks (prepare_kernel.h; the bits do not depend on them): pass 1 reads
// kPrepareDotRows rows against kPrepareDotQueries queries at a time, pass 2 sums kPrepareSumGroups
// groups for each of kPrepareSumQueries queries at a time. Pass 1 sweeps two lanes at a time (DPart), so
// SSE2's 16 registers hold 3 x 3 dot accumulators, 3 of squares, the 3 rows and a query, as on AVX2;
// pass 2's sums spill (a V16 takes four registers) and take the AVX2 path's blocks.
constexpr int kPrepareDotRows = 3;
constexpr int kPrepareDotQueries = 3;
constexpr int kPrepareSumQueries = 3;
constexpr int kPrepareSumGroups = 2;
