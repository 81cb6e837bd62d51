// Checks the scalar path's vfma (op_kernel/csrc/simd_scalar.h) against the C library's fmaf, bit for bit
// (NaN as NaN): random bit patterns, sums that nearly cancel (where rounding twice would show), results
// near float32's subnormal and overflow limits, and every triple of special values; then the same under
// flush-to-zero and round-toward-zero, where vfma must defer to fmaf. Prints the first differences; the
// exit status is the number of differences (capped at 100). Built and run by tests/test_isa_dispatch.py.

#include "isa_common.h"

#include <cfenv>
#include <cstdio>
#include <random>

namespace attnres {
namespace scalar_check {
#include "simd_scalar.h"
}  // namespace scalar_check
}  // namespace attnres

using attnres::scalar_check::V16;
using attnres::scalar_check::vfma;

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

// 16 triples at once, each lane against fmaf under the current environment.
static void check(const float* a, const float* b, const float* c) {
  V16 x, y, z;
  std::memcpy(x.l, a, sizeof x.l);
  std::memcpy(y.l, b, sizeof y.l);
  std::memcpy(z.l, c, sizeof z.l);
  const V16 r = vfma(x, y, z);
  for (int lane = 0; lane < 16; ++lane) {
    const float want = std::fmaf(a[lane], b[lane], c[lane]);
    const bool same = bits_of(r.l[lane]) == bits_of(want) || (std::isnan(r.l[lane]) && std::isnan(want));
    if (!same && differences++ < 10) {
      std::printf("vfma(%a, %a, %a) = %a, fmaf gives %a\n", a[lane], b[lane], c[lane], r.l[lane], want);
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

int main() {
  std::mt19937 gen(20261203);
  random_cases(gen, 200000);
  special_cases();
#if defined(__SSE2__)
  const unsigned default_csr = _mm_getcsr();
  _mm_setcsr(default_csr | 0x8040u);  // flush-to-zero and denormals-are-zero
  random_cases(gen, 20000);
  special_cases();
  _mm_setcsr(default_csr);
#endif
  std::fesetround(FE_TOWARDZERO);
  random_cases(gen, 20000);
  special_cases();
  std::fesetround(FE_TONEAREST);
  std::printf("%ld differences\n", differences);
  return static_cast<int>(std::min(differences, 100L));
}
