// V16, the 16 float32 lanes, for any CPU: an array, one lane at a time. Included by
// isa_scalar.cpp inside its namespace on CPUs other than x86 (x86 takes simd_sse2.h), and by
// tests/csrc/sse2_check.cpp as the reference simd_sse2.h is compared with. Every operation gives
// the bits of its vector counterparts in simd_avx2.h and simd_avx512.h: vfma rounds once like the
// FMA instructions (the C library's fmaf), lane_sum uses the same tree, bfloat16 uses the same lane
// layout (lane_element) and conversions (NaN to 0x7fc0), float16 converts like F16C.

struct V16 {
  float l[16];
};

inline V16 vzero() { return V16{}; }
inline V16 vset(float x) {
  V16 r;
  for (int i = 0; i < 16; ++i) r.l[i] = x;
  return r;
}

// a * b + c with one rounding.
inline V16 vfma(V16 a, V16 b, V16 c) {
  V16 r;
  for (int i = 0; i < 16; ++i) r.l[i] = std::fmaf(a.l[i], b.l[i], c.l[i]);
  return r;
}
// a * b + c for lanes whose product is exact in float32 when it is a normal float32 (or zero): the
// products of two 16-bit values and of a bfloat16 with a float32 of at most 16 significant bits
// (kernel_loops.h, add_runs). The same bits as vfma for those operands; simd_sse2.h uses the promise.
inline V16 vfma_exact_product(V16 a, V16 b, V16 c) { return vfma(a, b, c); }
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

inline V16 vload(const float* p) {
  V16 r;
  std::memcpy(r.l, p, sizeof r.l);
  return r;
}

// DPart, the float64 lanes that prepare's pass 1 sweeps at a time (prepare_kernel.h): here all 16 at once.
constexpr int kDotPartLanes = 16;
using DPart = D16;
inline DPart dpart_widen(const float* p) { return widen(vload(p)); }
inline DPart dpart_load(const double* p) { return dload(p); }
inline void dpart_store(double* p, DPart x) { dstore(p, x); }
inline DPart dpart_fma(DPart a, DPart b, DPart c) { return dfma(a, b, c); }

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

// No split bfloat16 lines (simd_avx512.h): this path has no shuffles to save.
constexpr bool kSplitBf16Lines = false;
// No stores of numbers only (simd_avx2.h): its conversions are the scalar from_float.
constexpr bool kBf16NumberStores = false;

// Rows add_runs reads at once (kernel_loops.h): nine, as the SSE2 lanes.
constexpr int kRunRows = 9;

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
