// Checks the scalar path's SSE2 lanes (op_kernel/csrc/simd_sse2.h, what x86 runs) against the portable
// lanes of simd_scalar.h (what other CPUs run), bit for bit. vfma against the C library's fmaf (NaN as
// NaN): random bit patterns, sums that nearly cancel, sums whose float64 rounding lands on a float32
// midpoint (where rounding twice would show) among normal and subnormal floats, results near float32's
// subnormal and overflow limits, every triple of special values; then the same under flush-to-zero and
// round-toward-zero, where vfma must defer to fmaf; vfma_exact_product likewise on the products it is
// promised. Every other operation (products, widening, float64 multiply-adds, the lane tree, bfloat16 and
// float16 loads and stores, the bfloat16 lane orders) on random bit patterns, the NaN payloads of loads,
// stores, conversions and shuffles included, the loads on every 16-bit pattern, also under flush-to-zero
// and round-toward-zero. Prints the first differences; the exit status is the number of differences (capped
// at 100). Built and run by tests/test_isa_dispatch.py.

#include "isa_common.h"

#include <cfenv>
#include <cstdio>
#include <random>

namespace attnres {
namespace portable {
#include "simd_scalar.h"
}  // namespace portable
namespace sse2 {
#include "simd_sse2.h"
}  // namespace sse2
}  // namespace attnres

using namespace attnres;

static uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
static float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

static long differences = 0;

static bool same_float(float x, float y) { return bits_of(x) == bits_of(y) || (std::isnan(x) && std::isnan(y)); }

static void report(const char* operation, int lane, double got, double want) {
  if (differences++ < 10) std::printf("%s, lane %d: %a, simd_scalar.h gives %a\n", operation, lane, got, want);
}

static sse2::V16 to_sse2(const float* lanes) { return sse2::vload(lanes); }
static void from_sse2(sse2::V16 v, float* lanes) { sse2::vstore(lanes, v); }
static portable::V16 to_portable(const float* lanes) { return portable::vload(lanes); }

// Arithmetic on several operands compares NaN as NaN: where several NaNs meet, which one comes out
// depends on the operand order, which the compiler picks. Loads, stores, conversions and shuffles
// compare NaN payloads too.
enum class Nan { kAny, kSameBits };

static void compare_lanes(const char* operation, sse2::V16 got, portable::V16 want, Nan nan = Nan::kSameBits) {
  float lanes[16];
  from_sse2(got, lanes);
  for (int lane = 0; lane < 16; ++lane) {
    const bool same = nan == Nan::kAny ? same_float(lanes[lane], want.l[lane])
                                       : bits_of(lanes[lane]) == bits_of(want.l[lane]);
    if (!same) report(operation, lane, lanes[lane], want.l[lane]);
  }
}

static bool same_double(double x, double y, Nan nan) {
  return std::memcmp(&x, &y, sizeof x) == 0 || (nan == Nan::kAny && std::isnan(x) && std::isnan(y));
}

static void compare_wide(const char* operation, sse2::D16 got, portable::D16 want, Nan nan = Nan::kSameBits) {
  double lanes[16];
  sse2::dstore(lanes, got);
  for (int lane = 0; lane < 16; ++lane) {
    if (!same_double(lanes[lane], want.l[lane], nan)) report(operation, lane, lanes[lane], want.l[lane]);
  }
}

// 16 triples at once, each lane against fmaf under the current environment.
static void check(const float* a, const float* b, const float* c) {
  float r[16];
  from_sse2(sse2::vfma(to_sse2(a), to_sse2(b), to_sse2(c)), r);
  for (int lane = 0; lane < 16; ++lane) {
    const float want = std::fmaf(a[lane], b[lane], c[lane]);
    if (!same_float(r[lane], want) && differences++ < 10) {
      std::printf("vfma(%a, %a, %a) = %a, fmaf gives %a\n", a[lane], b[lane], c[lane], r[lane], want);
    }
  }
}

static void random_cases(std::mt19937& gen, long batches) {
  std::uniform_real_distribution<float> unit(-2.0f, 2.0f);
  float a[16], b[16], c[16];
  for (long batch = 0; batch < batches; ++batch) {
    for (int lane = 0; lane < 16; ++lane) {
      a[lane] = from_bits(gen());
      b[lane] = from_bits(gen());
      switch (lane % 4) {
        case 0: c[lane] = from_bits(gen()); break;
        case 1: c[lane] = from_bits(bits_of(-a[lane] * b[lane]) + static_cast<int>(gen() % 5) - 2); break;
        case 2:
          a[lane] = unit(gen);
          b[lane] = unit(gen);
          c[lane] = -(a[lane] * b[lane]) * (1.0f + unit(gen) * 1e-7f);
          break;
        default:
          a[lane] = unit(gen) * std::ldexp(1.0f, static_cast<int>(gen() % 280) - 140);
          b[lane] = unit(gen) * std::ldexp(1.0f, static_cast<int>(gen() % 40) - 20);
          c[lane] = unit(gen) * std::ldexp(1.0f, static_cast<int>(gen() % 300) - 150);
      }
    }
    check(a, b, c);
  }
}

static void special_cases() {
  const float special[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 0x1p-149f, -0x1p-149f, 0x1p-126f, 0x1.fffffep127f,
                           -0x1.fffffep127f, 1.0f, -1.0f, 0.5f, 0x1.000002p0f, 3.0f, 0x1p-75f};
  const int n = sizeof special / sizeof special[0];
  float a[16], b[16], c[16];
  int lane = 0;
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < n; ++j) {
      for (int k = 0; k < n; ++k) {
        a[lane] = special[i];
        b[lane] = special[j];
        c[lane] = special[k];
        if (++lane == 16) {
          check(a, b, c);
          lane = 0;
        }
      }
    }
  }
}

// a * b within a few float64 units of half a unit of c (above or below), so that the float64 sum
// lands on a float32 midpoint while the exact sum does not: a = (1 + k 2^-23) 2^e, b = (1 -+ k 2^-23),
// a * b = 2^e (1 -+ k^2 2^-46) with e the exponent of half a unit of c.
static void midpoint_cases(std::mt19937& gen, long batches) {
  float a[16], b[16], c[16];
  for (long batch = 0; batch < batches; ++batch) {
    for (int lane = 0; lane < 16; ++lane) {
      const int exponent = static_cast<int>(gen() % 250) - 100;  // c's, so that half its unit stays normal
      c[lane] = std::ldexp(1.0f + static_cast<float>(gen() % (1u << 23)) * 0x1p-23f, exponent);
      if (gen() % 2) c[lane] = -c[lane];
      const float k = static_cast<float>(1 + gen() % 300) * 0x1p-23f;
      const float sign = gen() % 2 ? 1.0f : -1.0f;
      a[lane] = sign * std::ldexp(1.0f + k, exponent - 24);
      b[lane] = gen() % 2 ? 1.0f - k : 1.0f + k;
    }
    check(a, b, c);
  }
  // The same below float32's smallest normal, where the floats are 2^-149 apart: c subnormal (or the
  // smallest normals), a * b = 2^-150 (1 -+ k^2 2^-46).
  for (long batch = 0; batch < batches / 10; ++batch) {
    for (int lane = 0; lane < 16; ++lane) {
      c[lane] = static_cast<float>(gen() % (1u << 24)) * 0x1p-149f;
      if (gen() % 2) c[lane] = -c[lane];
      const float k = static_cast<float>(1 + gen() % 300) * 0x1p-23f;
      a[lane] = (gen() % 2 ? 1.0f : -1.0f) * std::ldexp(1.0f + k, -75);
      b[lane] = std::ldexp(gen() % 2 ? 1.0f - k : 1.0f + k, -75);
    }
    check(a, b, c);
  }
}

// vfma_exact_product against fmaf on what it is promised: products of two bfloat16 values, of two
// float16 values, and of a bfloat16 and a float32 of 16 significant bits (any bit patterns: subnormal,
// huge, zero, infinite and NaN operands, products that underflow or overflow), c any float.
static void exact_product_cases(std::mt19937& gen, long batches) {
  float a[16], b[16], c[16], r[16];
  for (long batch = 0; batch < batches; ++batch) {
    for (int lane = 0; lane < 16; ++lane) {
      const uint32_t kind = gen() % 3;
      if (kind == 2) {
        a[lane] = fp16_lane(FP16{static_cast<uint16_t>(gen())});
        b[lane] = fp16_lane(FP16{static_cast<uint16_t>(gen())});
      } else {
        a[lane] = from_bits(gen() & 0xffff0000u);
        b[lane] = from_bits(gen() & (kind == 0 ? 0xffff0000u : 0xffffff00u));
      }
      c[lane] = gen() % 2 ? from_bits(gen()) : a[lane] * b[lane] * -0.75f;
    }
    from_sse2(sse2::vfma_exact_product(to_sse2(a), to_sse2(b), to_sse2(c)), r);
    for (int lane = 0; lane < 16; ++lane) {
      const float want = std::fmaf(a[lane], b[lane], c[lane]);
      if (!same_float(r[lane], want) && differences++ < 10) {
        std::printf("vfma_exact_product(%a, %a, %a) = %a, fmaf gives %a\n", a[lane], b[lane], c[lane], r[lane], want);
      }
    }
  }
}

// Random float32 lanes: any bit pattern in some lanes, ordinary numbers in the others.
static void random_lanes(std::mt19937& gen, float* lanes) {
  std::normal_distribution<float> normal;
  for (int lane = 0; lane < 16; ++lane) lanes[lane] = gen() % 4 == 0 ? from_bits(gen()) : normal(gen);
}

static void other_operations(std::mt19937& gen, long batches) {
  for (long batch = 0; batch < batches; ++batch) {
    float x[16], y[16], z[16];
    random_lanes(gen, x);
    random_lanes(gen, y);
    random_lanes(gen, z);
    const sse2::V16 sx = to_sse2(x), sy = to_sse2(y), sz = to_sse2(z);
    const portable::V16 px = to_portable(x), py = to_portable(y), pz = to_portable(z);
    compare_lanes("vmul", sse2::vmul(sx, sy), portable::vmul(px, py), Nan::kAny);
    compare_lanes("vset", sse2::vset(x[0]), portable::vset(x[0]));
    compare_lanes("bf16_lanes_in_order", sse2::bf16_lanes_in_order(sx), portable::bf16_lanes_in_order(px));
    compare_lanes("bf16_lanes_from_order", sse2::bf16_lanes_from_order(sx), portable::bf16_lanes_from_order(px));
    compare_wide("widen", sse2::widen(sx), portable::widen(px));
    const sse2::D16 wide = sse2::dfma(sse2::widen(sx), sse2::widen(sy), sse2::widen(sz));
    const portable::D16 wide_want = portable::dfma(portable::widen(px), portable::widen(py), portable::widen(pz));
    compare_wide("dfma", wide, wide_want, Nan::kAny);
    const double sum = sse2::lane_sum(wide), sum_want = portable::lane_sum(wide_want);
    if (!same_double(sum, sum_want, Nan::kAny)) report("lane_sum", 0, sum, sum_want);

    uint16_t halves[16];
    for (int lane = 0; lane < 16; ++lane) halves[lane] = static_cast<uint16_t>(gen());
    BF16 bf16[16];
    FP16 fp16[16];
    std::memcpy(bf16, halves, sizeof bf16);
    std::memcpy(fp16, halves, sizeof fp16);
    compare_lanes("vload(BF16)", sse2::vload(bf16), portable::vload(bf16));
    compare_lanes("vload(FP16)", sse2::vload(fp16), portable::vload(fp16));

    BF16 bf16_got[16], bf16_want[16];
    FP16 fp16_got[16], fp16_want[16];
    sse2::vstore(bf16_got, sx);
    portable::vstore(bf16_want, px);
    sse2::vstore(fp16_got, sx);
    portable::vstore(fp16_want, px);
    for (int e = 0; e < 16; ++e) {
      if (bf16_got[e].bits != bf16_want[e].bits) report("vstore(BF16)", e, bf16_got[e].bits, bf16_want[e].bits);
      if (fp16_got[e].bits != fp16_want[e].bits) report("vstore(FP16)", e, fp16_got[e].bits, fp16_want[e].bits);
    }
    alignas(32) BF16 bf16_streamed[16];
    sse2::vstream(bf16_streamed, sx);
    sse2::stream_fence();
    if (std::memcmp(bf16_streamed, bf16_want, sizeof bf16_want) != 0) report("vstream(BF16)", 0, 0, 0);
  }
}

// Every bfloat16 and float16 bit pattern through the loads, 16 at a time.
static void every_16_bit_load() {
  for (uint32_t first = 0; first < 0x10000; first += 16) {
    BF16 bf16[16];
    FP16 fp16[16];
    for (int e = 0; e < 16; ++e) bf16[e].bits = fp16[e].bits = static_cast<uint16_t>(first + e);
    compare_lanes("vload(BF16)", sse2::vload(bf16), portable::vload(bf16));
    compare_lanes("vload(FP16)", sse2::vload(fp16), portable::vload(fp16));
  }
}

int main() {
  std::mt19937 gen(20261203);
  random_cases(gen, 200000);
  midpoint_cases(gen, 50000);
  exact_product_cases(gen, 50000);
  special_cases();
  other_operations(gen, 50000);
  every_16_bit_load();
  const unsigned default_csr = _mm_getcsr();
  _mm_setcsr(default_csr | 0x8040u);  // flush-to-zero and denormals-are-zero
  random_cases(gen, 20000);
  exact_product_cases(gen, 5000);
  special_cases();
  other_operations(gen, 5000);
  every_16_bit_load();
  _mm_setcsr(default_csr);
  std::fesetround(FE_TOWARDZERO);
  random_cases(gen, 20000);
  exact_product_cases(gen, 5000);
  special_cases();
  other_operations(gen, 5000);
  std::fesetround(FE_TONEAREST);
  std::printf("%ld differences\n", differences);
  return static_cast<int>(std::min(differences, 100L));
}
