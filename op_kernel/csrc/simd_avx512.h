// V16, the 16 float32 lanes, with AVX-512 (F, BW, VL): one 512-bit register. Included by
// isa_avx512.cpp and isa_avx512bf16.cpp inside their namespaces, after their target
// pragmas; ATTNRES_AVX512_BF16 (1 or 0) says whether AVX512-BF16 converts to bfloat16.
// The lanes hold the same elements as on the other instruction sets (lane_element), so
// every operation gives their bits.

struct V16 {
  __m512 v;
};

inline V16 vzero() { return {_mm512_setzero_ps()}; }
inline V16 vset(float x) { return {_mm512_set1_ps(x)}; }
inline V16 vfma(V16 a, V16 b, V16 c) { return {_mm512_fmadd_ps(a.v, b.v, c.v)}; }
inline V16 vmul(V16 a, V16 b) { return {_mm512_mul_ps(a.v, b.v)}; }

// The fixed combining tree: lanes l and l+8, then l and l+4, l and l+2, l and l+1.
inline float lane_sum(V16 x) {
  const __m256 lo = _mm512_castps512_ps256(x.v);
  const __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x.v), 1));
  const __m256 s8 = _mm256_add_ps(lo, hi);
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  const __m128 s1 = _mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1));
  return _mm_cvtss_f32(s1);
}

inline V16 vload(const float* p) { return {_mm512_loadu_ps(p)}; }

// bfloat16 in the lane layout of lane_element: lanes 0-7 the even elements (shifted up),
// lanes 8-15 the odd ones (low half masked off).
inline V16 vload(const BF16* p) {
  const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  const __m256i even = _mm256_slli_epi32(raw, 16);
  const __m256i odd = _mm256_and_si256(raw, _mm256_set1_epi32(static_cast<int>(0xffff0000u)));
  return {_mm512_castsi512_ps(_mm512_inserti64x4(_mm512_castsi256_si512(even), odd, 1))};
}

inline V16 vload(const FP16* p) {
  return {_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)))};
}

// Word e of a stored bfloat16 group comes from lane lane_element^-1(e): 0,8,1,9,..,7,15.
// kBf16HighWords picks the high word (the bfloat16) of that lane's 32 bits.
alignas(64) constexpr uint16_t kBf16HighWords[32] = {1,  17, 3,  19, 5,  21, 7,  23, 9, 25, 11,
                                                     27, 13, 29, 15, 31, 0,  0,  0,  0, 0,  0};
alignas(32) constexpr uint16_t kBf16Words[16] = {0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15};

// float32 -> bfloat16 by integer rounding, exactly as from_float<BF16>: round to nearest
// even, NaN to 0x7fc0; the 16 results in memory order.
inline __m256i pack_bf16_integer(__m512 x) {
  const __m512i bits = _mm512_castps_si512(x);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  __m512i rounded = _mm512_add_epi32(bits, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
  rounded = _mm512_mask_mov_epi32(rounded, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), _mm512_set1_epi32(0x7fc00000));
  const __m512i order = _mm512_load_si512(kBf16HighWords);
  return _mm512_castsi512_si256(_mm512_permutexvar_epi16(order, rounded));
}

#if ATTNRES_AVX512_BF16
// vcvtneps2bf16 rounds to nearest even like from_float<BF16>, but flushes denormal inputs
// to zero and keeps a NaN's sign and payload; a group holding either (vfpclassps: quiet
// or signalling NaN, denormal) takes the integer path instead, so the bits never differ.
inline __m256i pack_bf16(V16 x) {
  if (_mm512_fpclass_ps_mask(x.v, 0x01 | 0x20 | 0x80) != 0) return pack_bf16_integer(x.v);
  const __m256i converted = (__m256i)_mm512_cvtneps_pbh(x.v);
  return _mm256_permutexvar_epi16(_mm256_load_si256(reinterpret_cast<const __m256i*>(kBf16Words)), converted);
}
#else
inline __m256i pack_bf16(V16 x) { return pack_bf16_integer(x.v); }
#endif

inline __m256i pack_fp16(V16 x) { return _mm512_cvtps_ph(x.v, _MM_FROUND_TO_NEAREST_INT); }

inline void vstore(float* p, V16 x) { _mm512_storeu_ps(p, x.v); }
inline void vstore(BF16* p, V16 x) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), pack_bf16(x)); }
inline void vstore(FP16* p, V16 x) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), pack_fp16(x)); }

// Non-temporal stores: the line goes to memory without first being read (no
// read-for-ownership). p must be 32-byte aligned (can_stream), so float32 groups go as
// two 256-bit halves.
inline void vstream(float* p, V16 x) {
  _mm256_stream_ps(p, _mm512_castps512_ps256(x.v));
  _mm256_stream_ps(p + 8, _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x.v), 1)));
}
inline void vstream(BF16* p, V16 x) { _mm256_stream_si256(reinterpret_cast<__m256i*>(p), pack_bf16(x)); }
inline void vstream(FP16* p, V16 x) { _mm256_stream_si256(reinterpret_cast<__m256i*>(p), pack_fp16(x)); }
inline void stream_fence() { _mm_sfence(); }

inline void prefetch(const void* p) { _mm_prefetch(static_cast<const char*>(p), _MM_HINT_T0); }
