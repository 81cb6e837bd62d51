// V16, the 16 float32 lanes, for any CPU: an array, one lane at a time. Included by
// isa_scalar.cpp inside its namespace. Every operation gives the bits of its vector
// counterparts in simd_avx2.h and simd_avx512.h: vfma rounds once like the FMA
// instructions, lane_sum uses the same tree, bfloat16 uses the same lane layout
// (lane_element) and conversions (NaN to 0x7fc0), float16 converts like F16C.

struct V16 {
  float l[16];
};

inline V16 vzero() { return V16{}; }
inline V16 vset(float x) {
  V16 r;
  for (int i = 0; i < 16; ++i) r.l[i] = x;
  return r;
}
#if defined(__SSE2__)
// The baseline of x86-64 has SSE2 but no fused multiply-add, and there the C library's fmaf is a software
// routine (about 21 ns a call on a Zen 4 core with its FMA masked off, against 1.4 ns a lane here). So
// float32 a * b + c is computed in float64, two lanes at a time: the product of two float32 values is
// exact there, and the sum is rounded to odd (rounded to nearest, then, where inexact and even, moved one
// unit toward the exact sum, found by TwoSum); rounding that to float32 gives the correctly rounded fused
// multiply-add (Boldo and Melquiond, "Emulation of FMA and correctly rounded sums: proved algorithms
// using rounding to odd", 2008), the bits of an FMA instruction. It needs the default floating-point
// environment (round to nearest, no flush to zero, no denormals-are-zero): under any other MXCSR, vfma
// calls fmaf, which follows the environment as the instructions do.
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

// Four lanes of float32 a * b + c with one rounding, in the default floating-point environment.
inline __m128 fma_four(__m128 a, __m128 b, __m128 c) {
  const __m128d low = sum_rounded_to_odd(_mm_cvtps_pd(a), _mm_cvtps_pd(b), _mm_cvtps_pd(c));
  const __m128d high = sum_rounded_to_odd(_mm_cvtps_pd(_mm_movehl_ps(a, a)), _mm_cvtps_pd(_mm_movehl_ps(b, b)),
                                          _mm_cvtps_pd(_mm_movehl_ps(c, c)));
  return _mm_movelh_ps(_mm_cvtpd_ps(low), _mm_cvtpd_ps(high));
}

// MXCSR's rounding control, flush-to-zero and denormals-are-zero bits: all clear by default.
constexpr unsigned kNonDefaultMxcsr = 0xe040u;
#endif

// a * b + c with one rounding.
inline V16 vfma(V16 a, V16 b, V16 c) {
  V16 r;
#if defined(__SSE2__)
  if (__builtin_expect((_mm_getcsr() & kNonDefaultMxcsr) == 0, 1)) {
    for (int i = 0; i < 16; i += 4) {
      _mm_storeu_ps(r.l + i, fma_four(_mm_loadu_ps(a.l + i), _mm_loadu_ps(b.l + i), _mm_loadu_ps(c.l + i)));
    }
    return r;
  }
#endif
  for (int i = 0; i < 16; ++i) r.l[i] = std::fmaf(a.l[i], b.l[i], c.l[i]);
  return r;
}
inline V16 vmul(V16 a, V16 b) {
  V16 r;
  for (int i = 0; i < 16; ++i) r.l[i] = a.l[i] * b.l[i];
  return r;
}
// D16, the same 16 lanes in float64: the accumulators of the sums over hidden that feed
// per-token scalars (simd_avx512.h says why).
struct D16 {
  double l[16];
};

inline D16 dzero() { return D16{}; }
inline D16 widen(V16 v) {
  D16 r;
  for (int i = 0; i < 16; ++i) r.l[i] = v.l[i];
  return r;
}
inline D16 dload(const double* p) {
  D16 r;
  std::memcpy(r.l, p, sizeof r.l);
  return r;
}
inline void dstore(double* p, D16 v) { std::memcpy(p, v.l, sizeof v.l); }
// a * b + c. The product of two widened float32 values is exact in float64, so a multiply
// then an add rounds once, like the FMA instructions of the vector paths.
inline D16 dfma(D16 a, D16 b, D16 c) {
  D16 r;
  for (int i = 0; i < 16; ++i) r.l[i] = a.l[i] * b.l[i] + c.l[i];
  return r;
}
// The fixed combining tree: lanes l and l+8, then l and l+4, l and l+2, l and l+1.
inline double lane_sum(D16 v) {
  double s[8];
  for (int i = 0; i < 8; ++i) s[i] = v.l[i] + v.l[i + 8];
  for (int i = 0; i < 4; ++i) s[i] = s[i] + s[i + 4];
  for (int i = 0; i < 2; ++i) s[i] = s[i] + s[i + 2];
  return s[0] + s[1];
}

// float16 -> float32 as vcvtph2ps does it: exact, a signalling NaN comes back quiet.
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

inline V16 vload(const float* p) {
  V16 r;
  std::memcpy(r.l, p, sizeof r.l);
  return r;
}
inline V16 vload(const BF16* p) {
  V16 r;
  for (int lane = 0; lane < 16; ++lane) r.l[lane] = to_float(p[lane_element<BF16>(lane)]);
  return r;
}
// The lanes of a bfloat16 group (lane_element) put in element order (lane l = element l), and back:
// what the update kernel needs to add a bfloat16 row to a float32 one.
inline V16 bf16_lanes_in_order(V16 x) {
  V16 r;
  for (int lane = 0; lane < 16; ++lane) r.l[lane_element<BF16>(lane)] = x.l[lane];
  return r;
}
inline V16 bf16_lanes_from_order(V16 x) {
  V16 r;
  for (int lane = 0; lane < 16; ++lane) r.l[lane] = x.l[lane_element<BF16>(lane)];
  return r;
}

inline V16 vload(const FP16* p) {
  V16 r;
  for (int lane = 0; lane < 16; ++lane) r.l[lane] = fp16_lane(p[lane]);
  return r;
}

inline void vstore(float* p, V16 v) { std::memcpy(p, v.l, sizeof v.l); }
inline void vstore(BF16* p, V16 v) {
  for (int lane = 0; lane < 16; ++lane) p[lane_element<BF16>(lane)] = from_float<BF16>(v.l[lane]);
}
inline void vstore(FP16* p, V16 v) {
  for (int lane = 0; lane < 16; ++lane) p[lane] = fp16_pack_lane(v.l[lane]);
}

// No portable non-temporal store: a plain one (the same bits).
template <typename T>
inline void vstream(T* p, V16 v) {
  vstore(p, v);
}

inline void stream_fence() {}
inline void prefetch(const void* p) { __builtin_prefetch(p); }
// The same into L2 only, for lines needed after this pass rather than within it.
inline void prefetch_l2(const void* p) { __builtin_prefetch(p, 0, 2); }

// Float32 pass 1 walks each group of rows over all of H (kernel_loops.h; no one times this path).
constexpr int64_t kFloat32RowChunk = 0;

// The prepare kernel's register blocks (prepare_kernel.h; the bits do not depend on them): pass 1 reads
// kPrepareDotRows rows against kPrepareDotQueries queries at a time, pass 2 sums kPrepareSumGroups
// groups for each of kPrepareSumQueries queries at a time. As the AVX2 path's (no one times
// this path).
constexpr int kPrepareDotRows = 1;
constexpr int kPrepareDotQueries = 2;
constexpr int kPrepareSumQueries = 4;
constexpr int kPrepareSumGroups = 1;
