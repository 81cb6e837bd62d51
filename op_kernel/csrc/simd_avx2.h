// V16, the 16 float32 lanes, with AVX2, FMA and F16C: two 8-wide registers. Included by
// isa_avx2.cpp inside its namespace, after its target pragma.

struct V16 {
  __m256 lo, hi;
};

inline V16 vzero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
inline V16 vset(float x) { return {_mm256_set1_ps(x), _mm256_set1_ps(x)}; }
inline V16 vfma(V16 a, V16 b, V16 c) { return {_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)}; }
inline V16 vmul(V16 a, V16 b) { return {_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)}; }
// a * b + c for lanes whose product is exact in float32 when it is a normal float32 (or zero): the
// products of two 16-bit values and of a bfloat16 with a float32 of at most 16 significant bits
// (kernel_loops.h, add_runs). The same bits as vfma for those operands; simd_sse2.h uses the promise.
inline V16 vfma_exact_product(V16 a, V16 b, V16 c) { return vfma(a, b, c); }

// D16, the same 16 lanes in float64, four registers of 4 (lanes 0-3, 4-7, 8-11, 12-15): the
// accumulators of the sums over hidden that feed per-token scalars (simd_avx512.h says why).
struct D16 {
  __m256d q0, q1, q2, q3;
};

inline D16 dzero() { return {_mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd()}; }
inline D16 widen(V16 v) {
  return {_mm256_cvtps_pd(_mm256_castps256_ps128(v.lo)), _mm256_cvtps_pd(_mm256_extractf128_ps(v.lo, 1)),
          _mm256_cvtps_pd(_mm256_castps256_ps128(v.hi)), _mm256_cvtps_pd(_mm256_extractf128_ps(v.hi, 1))};
}
inline D16 dload(const double* p) {
  return {_mm256_loadu_pd(p), _mm256_loadu_pd(p + 4), _mm256_loadu_pd(p + 8), _mm256_loadu_pd(p + 12)};
}
inline void dstore(double* p, D16 v) {
  _mm256_storeu_pd(p, v.q0);
  _mm256_storeu_pd(p + 4, v.q1);
  _mm256_storeu_pd(p + 8, v.q2);
  _mm256_storeu_pd(p + 12, v.q3);
}
inline D16 dfma(D16 a, D16 b, D16 c) {
  return {_mm256_fmadd_pd(a.q0, b.q0, c.q0), _mm256_fmadd_pd(a.q1, b.q1, c.q1), _mm256_fmadd_pd(a.q2, b.q2, c.q2),
          _mm256_fmadd_pd(a.q3, b.q3, c.q3)};
}

// DPart, four of the 16 float64 lanes in one register: what prepare's pass 1 sweeps at a time
// (simd_avx512.h says why).
constexpr int kDotPartLanes = 4;
struct DPart {
  __m256d v;
};
inline DPart dpart_widen(const float* p) { return {_mm256_cvtps_pd(_mm_loadu_ps(p))}; }
inline DPart dpart_load(const double* p) { return {_mm256_loadu_pd(p)}; }
inline void dpart_store(double* p, DPart x) { _mm256_storeu_pd(p, x.v); }
inline DPart dpart_fma(DPart a, DPart b, DPart c) { return {_mm256_fmadd_pd(a.v, b.v, c.v)}; }

// The fixed combining tree: lanes l and l+8, then l and l+4, l and l+2, l and l+1.
inline double lane_sum(D16 v) {
  const __m256d s8_low = _mm256_add_pd(v.q0, v.q2), s8_high = _mm256_add_pd(v.q1, v.q3);  // lanes 0-3, 4-7
  const __m256d s4 = _mm256_add_pd(s8_low, s8_high);
  const __m128d s2 = _mm_add_pd(_mm256_castpd256_pd128(s4), _mm256_extractf128_pd(s4, 1));
  const __m128d s1 = _mm_add_sd(s2, _mm_unpackhi_pd(s2, s2));
  return _mm_cvtsd_f64(s1);
}

inline V16 vload(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }

// bfloat16 in the lane layout of lane_element: `lo` takes the even elements (shifted
// up), `hi` the odd ones (low half masked off).
inline V16 vload(const BF16* p) {
  const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return {_mm256_castsi256_ps(_mm256_slli_epi32(raw, 16)),
          _mm256_castsi256_ps(_mm256_and_si256(raw, _mm256_set1_epi32(static_cast<int>(0xffff0000u))))};
}

// The lanes of a bfloat16 group (lane_element: lo the even elements, hi the odd ones) put in element
// order (lo elements 0-7, hi 8-15), and back: what the update kernel needs to add a bfloat16 row to a
// float32 one.
inline V16 bf16_lanes_in_order(V16 x) {
  const __m256 low = _mm256_unpacklo_ps(x.lo, x.hi);   // elements 0-3 | 8-11
  const __m256 high = _mm256_unpackhi_ps(x.lo, x.hi);  // elements 4-7 | 12-15
  return {_mm256_permute2f128_ps(low, high, 0x20), _mm256_permute2f128_ps(low, high, 0x31)};
}
inline V16 bf16_lanes_from_order(V16 x) {
  // Per 128-bit half: the even (odd) elements of lo and hi, then their 64-bit pairs in order.
  const __m256 even = _mm256_shuffle_ps(x.lo, x.hi, _MM_SHUFFLE(2, 0, 2, 0));  // 0 2 8 10 | 4 6 12 14
  const __m256 odd = _mm256_shuffle_ps(x.lo, x.hi, _MM_SHUFFLE(3, 1, 3, 1));   // 1 3 9 11 | 5 7 13 15
  constexpr int kPairsInOrder = _MM_SHUFFLE(3, 1, 2, 0);
  return {_mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(even), kPairsInOrder)),
          _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(odd), kPairsInOrder))};
}

// Two 128-bit loads, each converted from memory: no cross-lane extract (a shuffle, on Intel's port 5
// beside the conversions themselves).
inline V16 vload(const FP16* p) {
  return {_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))),
          _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 8)))};
}

// float32 -> bfloat16, round to nearest even, 8 at a time, for numbers (a NaN may come out as
// anything): the 16-bit result in the top half of each 32-bit slot (the bottom half is garbage).
inline __m256i bf16_rounded_high_bits(__m256 x) {
  const __m256i bits = _mm256_castps_si256(x);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  return _mm256_add_epi32(bits, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff)));
}

// The same with NaN -> 0x7fc0.
inline __m256i bf16_high_bits(__m256 x) {
  const __m256 is_nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
  return _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(bf16_rounded_high_bits(x)),
                                              _mm256_castsi256_ps(_mm256_set1_epi32(0x7fc00000)), is_nan));
}

// The inverse of vload(const BF16*) for numbers (a NaN may come out as anything): even elements from
// lo, odd from hi, in memory order.
inline __m256i pack_bf16_numbers(V16 v) {
  return _mm256_blend_epi16(_mm256_srli_epi32(bf16_rounded_high_bits(v.lo), 16), bf16_rounded_high_bits(v.hi),
                            0xaa);
}

// The same for any values. One comparison finds a NaN in either half; only then do the halves take the
// blend that makes it 0x7fc0 (on this path's CPUs a blend costs more than the rounding, and NaN outputs
// are rare).
inline __m256i pack_bf16_integer(V16 v) {
  if (_mm256_movemask_ps(_mm256_cmp_ps(v.lo, v.hi, _CMP_UNORD_Q)) != 0) {
    return _mm256_blend_epi16(_mm256_srli_epi32(bf16_high_bits(v.lo), 16), bf16_high_bits(v.hi), 0xaa);
  }
  return pack_bf16_numbers(v);
}

inline __m256i pack_bf16(V16 v) { return pack_bf16_integer(v); }

inline __m256i pack_fp16(V16 v) {
  return _mm256_set_m128i(_mm256_cvtps_ph(v.hi, _MM_FROUND_TO_NEAREST_INT),
                          _mm256_cvtps_ph(v.lo, _MM_FROUND_TO_NEAREST_INT));
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

// Stores of bfloat16 groups known to hold no NaN (kernel_loops.h, kNumberStores): pack_bf16's check and
// its branch took 5-6% of the bfloat16 backward's time and 3-4% of the forward's (Zen 4, from memory).
constexpr bool kBf16NumberStores = true;
inline void vstore_numbers(BF16* p, V16 v) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), pack_bf16_numbers(v));
}
inline void vstream_numbers(BF16* p, V16 v) {
  _mm256_stream_si256(reinterpret_cast<__m256i*>(p), pack_bf16_numbers(v));
}

inline void prefetch(const void* p) { _mm_prefetch(static_cast<const char*>(p), _MM_HINT_T0); }
// The same into L2 only, for lines needed after this pass rather than within it.
inline void prefetch_l2(const void* p) { _mm_prefetch(static_cast<const char*>(p), _MM_HINT_T1); }

// No split bfloat16 lines (simd_avx512.h): this path's bfloat16 loads are a shift and a mask already.
constexpr bool kSplitBf16Lines = false;

// Rows add_runs reads at once (kernel_loops.h): three, whose six run sums (12 registers) stay in AVX2's
// 16; nine spilled them. Faster from cache and on one thread from memory (the same within noise on two)
// once the next token's prefetches were spread over the three groups' walks (forward_kernel.h,
// prefetch_rank; docs/notes/kernel-variants.md).
constexpr int kRunRows = 3;

// Float32 pass 1 walks each group of rows over all of H (kernel_loops.h): chunks measured slower here.
constexpr int64_t kFloat32RowChunk = 0;

// The prepare kernel's register blocks (prepare_kernel.h; the bits do not depend on them): pass 1 reads
// kPrepareDotRows rows against kPrepareDotQueries queries at a time, pass 2 sums kPrepareSumGroups
// groups for each of kPrepareSumQueries queries at a time. Pass 1 sweeps a quarter of the lanes at a time
// (DPart), so AVX2's 16 registers hold 3 x 3 dot accumulators, 3 of squares, the 3 rows and a query; pass
// 2 holds 3 queries x 2 groups of numerator sums (12). Timed from cache on an AMD Zen 4 host (N = S = 8,
// D = 2048): 3 x 3 quarter-lane dots 1.1-1.15 times as fast as the earlier 1 x 2 whole-lane ones, 2 x 4
// slower than 3 x 3; 4 queries x 1 group of sums 1.1-1.2 times as slow (docs/notes/kernel-variants.md).
constexpr int kPrepareDotRows = 3;
constexpr int kPrepareDotQueries = 3;
constexpr int kPrepareSumQueries = 3;
constexpr int kPrepareSumGroups = 2;
