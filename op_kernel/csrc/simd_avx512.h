// V16, the 16 float32 lanes, with AVX-512 (F, BW, VL): one 512-bit register. Included by
// isa_avx512.cpp and isa_avx512bf16.cpp inside their namespaces, after their target pragmas;
// ATTNRES_AVX512_BF16 (1 or 0) says whether AVX512-BF16 (with DQ) converts to bfloat16.
// The lanes hold the same elements as on the other instruction sets (lane_element), so
// every operation gives their bits.

struct V16 {
  __m512 v;
};

inline V16 vzero() { return {_mm512_setzero_ps()}; }
inline V16 vset(float x) { return {_mm512_set1_ps(x)}; }
inline V16 vfma(V16 a, V16 b, V16 c) { return {_mm512_fmadd_ps(a.v, b.v, c.v)}; }
inline V16 vmul(V16 a, V16 b) { return {_mm512_mul_ps(a.v, b.v)}; }
// a * b + c for lanes whose product is exact in float32 when it is a normal float32 (or zero): the
// products of two 16-bit values and of a bfloat16 with a float32 of at most 16 significant bits
// (kernel_loops.h, add_runs). The same bits as vfma for those operands; simd_sse2.h uses the promise.
inline V16 vfma_exact_product(V16 a, V16 b, V16 c) { return vfma(a, b, c); }

// D16, the same 16 lanes in float64 (lanes 0-7 in lo, 8-15 in hi): the accumulators of the
// sums over hidden that feed per-token scalars (norms, scores, the backward's coefficients).
// In float32 lanes, H/16 terms per lane, their rounding error grows with H and moves a
// peaked softmax past the contract's tolerance; in float64 it stays far below it.
struct D16 {
  __m512d lo, hi;
};

inline D16 dzero() { return {_mm512_setzero_pd(), _mm512_setzero_pd()}; }
inline D16 widen(V16 x) {
  return {_mm512_cvtps_pd(_mm512_castps512_ps256(x.v)),
          _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x.v), 1)))};
}
inline D16 dload(const double* p) { return {_mm512_loadu_pd(p), _mm512_loadu_pd(p + 8)}; }
inline void dstore(double* p, D16 x) {
  _mm512_storeu_pd(p, x.lo);
  _mm512_storeu_pd(p + 8, x.hi);
}
inline D16 dfma(D16 a, D16 b, D16 c) { return {_mm512_fmadd_pd(a.lo, b.lo, c.lo), _mm512_fmadd_pd(a.hi, b.hi, c.hi)}; }

// DPart, kDotPartLanes of the 16 float64 lanes in one register: prepare's pass 1 sweeps a group's lanes
// part by part (prepare_kernel.h), so that one register holds one accumulator and a load of a query
// serves more rows. Each lane's sum runs through the same elements in the same order either way.
constexpr int kDotPartLanes = 8;
struct DPart {
  __m512d v;
};
inline DPart dpart_widen(const float* p) { return {_mm512_cvtps_pd(_mm256_loadu_ps(p))}; }
inline DPart dpart_load(const double* p) { return {_mm512_loadu_pd(p)}; }
inline void dpart_store(double* p, DPart x) { _mm512_storeu_pd(p, x.v); }
inline DPart dpart_fma(DPart a, DPart b, DPart c) { return {_mm512_fmadd_pd(a.v, b.v, c.v)}; }

// The fixed combining tree: lanes l and l+8, then l and l+4, l and l+2, l and l+1.
inline double lane_sum(D16 x) {
  const __m512d s8 = _mm512_add_pd(x.lo, x.hi);
  const __m256d s4 = _mm256_add_pd(_mm512_castpd512_pd256(s8), _mm512_extractf64x4_pd(s8, 1));
  const __m128d s2 = _mm_add_pd(_mm256_castpd256_pd128(s4), _mm256_extractf128_pd(s4, 1));
  const __m128d s1 = _mm_add_sd(s2, _mm_unpackhi_pd(s2, s2));
  return _mm_cvtsd_f64(s1);
}

inline V16 vload(const float* p) { return {_mm512_loadu_ps(p)}; }

// bfloat16 in the lane layout of lane_element (lanes 0-7 the even elements, 8-15 the odd
// ones). The 32 bytes are loaded into both halves of the register (a broadcast: the load unit's
// work), so lane l's 32 bits hold, in either half, elements 2(l mod 8) and 2(l mod 8) + 1: one
// in-lane byte shuffle then moves the even element (low half) or the odd one (high half) to the
// high half and zeroes the low half. (A cross-lane word permutation did this in one instruction
// too, but its zeroing mask cost another on the same port, in the loop every pass runs.)
alignas(64) constexpr int8_t kBf16LoadBytes[64] = {
    -1, -1, 0, 1, -1, -1, 4, 5, -1, -1, 8,  9,  -1, -1, 12, 13, -1, -1, 0, 1, -1, -1, 4, 5, -1, -1, 8,  9,  -1, -1, 12, 13,
    -1, -1, 2, 3, -1, -1, 6, 7, -1, -1, 10, 11, -1, -1, 14, 15, -1, -1, 2, 3, -1, -1, 6, 7, -1, -1, 10, 11, -1, -1, 14, 15};
inline V16 vload(const BF16* p) {
  const __m512i both = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return {_mm512_castsi512_ps(_mm512_shuffle_epi8(both, _mm512_load_si512(kBf16LoadBytes)))};
}

// The lanes of a bfloat16 group (lane_element) put in element order (lane l = element l), and back:
// what the update kernel needs to add a bfloat16 row to a float32 one. kBf16LanesInOrder[e] is the
// lane of element e; kBf16LanesFromOrder[l] the element of lane l.
alignas(64) constexpr int32_t kBf16LanesInOrder[16] = {0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15};
alignas(64) constexpr int32_t kBf16LanesFromOrder[16] = {0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15};
inline V16 bf16_lanes_in_order(V16 x) {
  return {_mm512_permutexvar_ps(_mm512_load_si512(kBf16LanesInOrder), x.v)};
}
inline V16 bf16_lanes_from_order(V16 x) {
  return {_mm512_permutexvar_ps(_mm512_load_si512(kBf16LanesFromOrder), x.v)};
}

inline V16 vload(const FP16* p) {
  return {_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)))};
}

// Word e of a stored bfloat16 group comes from lane lane_element^-1(e): 0,8,1,9,..,7,15.
// kBf16HighWords picks the high word (the bfloat16) of that lane's 32 bits.
alignas(64) constexpr uint16_t kBf16HighWords[32] = {1,  17, 3,  19, 5,  21, 7,  23, 9, 25, 11,
                                                     27, 13, 29, 15, 31, 0,  0,  0,  0, 0,  0};
// The same for two groups: the high words of a's lanes, then of b's (indices 32 and up).
alignas(64) constexpr uint16_t kBf16PairHighWords[32] = {1,  17, 3,  19, 5,  21, 7,  23, 9,  25, 11,
                                                         27, 13, 29, 15, 31, 33, 49, 35, 51, 37, 53,
                                                         39, 55, 41, 57, 43, 59, 45, 61, 47, 63};

// float32 -> bfloat16 by integer rounding, exactly as from_float<BF16>: round to nearest
// even, NaN to 0x7fc0; the 16 results in memory order.
// Each 32-bit lane rounded, its bfloat16 in the high half.
inline __m512i bf16_rounded_lanes(__m512 x) {
  const __m512i bits = _mm512_castps_si512(x);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_add_epi32(bits, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
  return _mm512_mask_mov_epi32(rounded, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), _mm512_set1_epi32(0x7fc00000));
}

inline __m256i pack_bf16_integer(__m512 x) {
  const __m512i order = _mm512_load_si512(kBf16HighWords);
  return _mm512_castsi512_si256(_mm512_permutexvar_epi16(order, bf16_rounded_lanes(x)));
}

// Two groups at once: 32 bfloat16 in memory order, a's first.
inline __m512i pack_bf16_pair_integer(__m512 a, __m512 b) {
  const __m512i order = _mm512_load_si512(kBf16PairHighWords);
  return _mm512_permutex2var_epi16(bf16_rounded_lanes(a), order, bf16_rounded_lanes(b));
}

#if ATTNRES_AVX512_BF16
// With AVX512-BF16: vcvtne2ps2bf16 rounds to nearest even like from_float<BF16>, but flushes
// subnormal inputs to zero and keeps a NaN's sign and payload; groups holding either
// (vfpclassps: quiet or signalling NaN, subnormal) take the integer rounding instead, so the
// bits never differ. The converted words come in lane order and are put in memory order by
// one permutation: kBf16LaneWords picks, for word e of a stored group, lane 0,8,1,9,..,7,15.
constexpr int kNanOrSubnormal = 0x01 | 0x20 | 0x80;
alignas(32) constexpr uint16_t kBf16LaneWords[16] = {0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15};
// The same for two groups converted together (_mm512_cvtne2ps_pbh(a, b) puts b's words first).
alignas(64) constexpr uint16_t kBf16PairLaneWords[32] = {16, 24, 17, 25, 18, 26, 19, 27, 20, 28, 21,
                                                          29, 22, 30, 23, 31, 0,  8,  1,  9,  2,  10,
                                                          3,  11, 4,  12, 5,  13, 6,  14, 7,  15};
inline __m256i pack_bf16(V16 x) {
  if (_mm512_fpclass_ps_mask(x.v, kNanOrSubnormal) != 0) return pack_bf16_integer(x.v);
  const __m256i lanes = (__m256i)_mm512_cvtneps_pbh(x.v);
  return _mm256_permutexvar_epi16(_mm256_load_si256(reinterpret_cast<const __m256i*>(kBf16LaneWords)), lanes);
}
// Two groups' 32 words by one conversion, first's words then second's, put in memory order by
// word_order; or, where either holds a NaN or subnormal, integer_pack(). Forced inline: GCC has left
// pack_bf16_pair a call in the backward's pass 2 (a change elsewhere in the translation unit moved its
// inlining budget), 5% of the bfloat16 backward from cache.
template <typename IntegerPack>
[[gnu::always_inline]] inline __m512i convert_bf16_two(V16 first, V16 second, const uint16_t* word_order,
                                                       const IntegerPack& integer_pack) {
  if ((_mm512_fpclass_ps_mask(first.v, kNanOrSubnormal) | _mm512_fpclass_ps_mask(second.v, kNanOrSubnormal)) != 0) {
    return integer_pack();
  }
  const __m512i words = (__m512i)_mm512_cvtne2ps_pbh(second.v, first.v);  // its second operand's words first
  return _mm512_permutexvar_epi16(_mm512_load_si512(word_order), words);
}
[[gnu::always_inline]] inline __m512i pack_bf16_pair(V16 a, V16 b) {
  return convert_bf16_two(b, a, kBf16PairLaneWords, [&] { return pack_bf16_pair_integer(a.v, b.v); });
}
#else
inline __m256i pack_bf16(V16 x) { return pack_bf16_integer(x.v); }
inline __m512i pack_bf16_pair(V16 a, V16 b) { return pack_bf16_pair_integer(a.v, b.v); }
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

// Two consecutive bfloat16 groups converted together (kernel_loops.h stores other pairs group by
// group). Streaming halves: p is only known to be 32-byte aligned.
inline void vstore_pair(BF16* p, V16 a, V16 b) { _mm512_storeu_si512(p, pack_bf16_pair(a, b)); }
inline void vstream_pair(BF16* p, V16 a, V16 b) {
  const __m512i packed = pack_bf16_pair(a, b);
  _mm256_stream_si256(reinterpret_cast<__m256i*>(p), _mm512_castsi512_si256(packed));
  _mm256_stream_si256(reinterpret_cast<__m256i*>(p + 16), _mm512_extracti64x4_epi64(packed, 1));
}
inline void stream_fence() { _mm_sfence(); }

// A line of 32 bfloat16 as two groups whose lanes are not lane_element's: the even elements (lane l =
// element 2l) and the odd ones (2l + 1), by one load, one shift and one mask where two vloads take two
// loads and two byte shuffles. Only for sums that go element by element into a stored row (the
// forward's pass 2), whose lanes nothing else sees (docs/notes/kernel-variants.md).
constexpr bool kSplitBf16Lines = true;
// No stores of numbers only (simd_avx2.h): the integer rounding masks NaNs without a branch, and the
// AVX512-BF16 conversion's check is for subnormals too.
constexpr bool kBf16NumberStores = false;
inline void vload_split(const BF16* p, V16& even, V16& odd) {
  const __m512i raw = _mm512_loadu_si512(p);
  even = {_mm512_castsi512_ps(_mm512_slli_epi32(raw, 16))};
  odd = {_mm512_castsi512_ps(_mm512_and_si512(raw, _mm512_set1_epi32(static_cast<int>(0xffff0000u))))};
}

// Its inverse, rounded as from_float<BF16>: the 32 bfloat16 in memory order.
inline __m512i pack_bf16_split_integer(__m512 even, __m512 odd) {
  constexpr __mmask32 kOddWords = 0xaaaaaaaau;
  return _mm512_mask_blend_epi16(kOddWords, _mm512_srli_epi32(bf16_rounded_lanes(even), 16), bf16_rounded_lanes(odd));
}
#if ATTNRES_AVX512_BF16
// Converted together as pack_bf16_pair, even's words first; kBf16SplitWords interleaves them.
alignas(64) constexpr uint16_t kBf16SplitWords[32] = {0, 16, 1, 17, 2,  18, 3,  19, 4,  20, 5,  21, 6,  22, 7,  23,
                                                      8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
[[gnu::always_inline]] inline __m512i pack_bf16_split(V16 even, V16 odd) {
  return convert_bf16_two(even, odd, kBf16SplitWords, [&] { return pack_bf16_split_integer(even.v, odd.v); });
}
#else
inline __m512i pack_bf16_split(V16 even, V16 odd) { return pack_bf16_split_integer(even.v, odd.v); }
#endif
// Forced inline, as convert_bf16_two: once the backward's pass 2 called them too, GCC made them calls
// (its bfloat16 backward 1.5 times as slow from memory).
[[gnu::always_inline]] inline void vstore_split(BF16* p, V16 even, V16 odd) {
  _mm512_storeu_si512(p, pack_bf16_split(even, odd));
}
[[gnu::always_inline]] inline void vstream_split(BF16* p, V16 even, V16 odd) {  // p: 32-byte aligned, as vstream_pair
  const __m512i packed = pack_bf16_split(even, odd);
  _mm256_stream_si256(reinterpret_cast<__m256i*>(p), _mm512_castsi512_si256(packed));
  _mm256_stream_si256(reinterpret_cast<__m256i*>(p + 16), _mm512_extracti64x4_epi64(packed, 1));
}

inline void prefetch(const void* p) { _mm_prefetch(static_cast<const char*>(p), _MM_HINT_T0); }
// The same into L2 only, for lines needed after this pass rather than within it.
inline void prefetch_l2(const void* p) { _mm_prefetch(static_cast<const char*>(p), _MM_HINT_T1); }

// Rows add_runs reads at once (kernel_loops.h): all of a token's rows up to nine, whose 18 run sums stay
// in AVX-512's 32 registers.
constexpr int kRunRows = 9;

// Float32 pass 1 walks H in chunks of this many elements across all of a token's rows (kernel_loops.h).
constexpr int64_t kFloat32RowChunk = 64;

// The prepare kernel's register blocks (prepare_kernel.h; the bits do not depend on them): pass 1 reads
// kPrepareDotRows rows against kPrepareDotQueries queries at a time, pass 2 sums kPrepareSumGroups
// groups for each of kPrepareSumQueries queries at a time. Pass 1 sweeps half the lanes at a time
// (DPart), so AVX-512's 32 registers hold 4 x 4 dot accumulators, 4 of squares and the 4 rows; pass 2
// holds 4 queries x 4 groups of numerator sums (16). Timed from cache on an AMD Zen 4 host (N = S = 8,
// D = 2048): 4 x 4 half-lane dots 1.15-1.3 times as fast as the earlier 2 x 4 whole-lane ones; 4 queries
// x 2 groups of sums 1.1-1.15 times as slow (docs/notes/kernel-variants.md).
constexpr int kPrepareDotRows = 4;
constexpr int kPrepareDotQueries = 4;
constexpr int kPrepareSumQueries = 4;
constexpr int kPrepareSumGroups = 4;
