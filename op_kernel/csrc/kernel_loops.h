// The loops the forward and backward kernels share, written against the V16 operations of
// the instruction set being compiled (simd_*.h): included inside that instruction set's
// namespace by isa_*.cpp, after its target pragma, never on its own.

// n accumulators of this instruction set's vector type V, zeroed, on the heap. (std::vector<V>
// would instantiate library code that is compiled for the baseline instruction set yet moves this
// instruction set's vectors.)
template <class V>
class VectorArray {
 public:
  explicit VectorArray(int64_t n) : data_(new V[n]()) {}
  ~VectorArray() { delete[] data_; }
  VectorArray(const VectorArray&) = delete;
  VectorArray& operator=(const VectorArray&) = delete;
  V& operator[](int64_t i) { return data_[i]; }
  V* data() { return data_; }

 private:
  V* data_;
};
using LaneArray = VectorArray<D16>;

// body(i) for every i in [0, tasks) on at most max_threads threads (thread_pool.h).
template <typename Body>
inline void parallel_tasks(int64_t tasks, int max_threads, const Body& body) {
  run_tasks(
      tasks, max_threads, [](void* context, int64_t task) { (*static_cast<const Body*>(context))(task); },
      const_cast<void*>(static_cast<const void*>(&body)));
}

// Two consecutive groups (32 elements of a 16-bit type), stored group by group. An instruction set
// that converts a pair at once declares its own vstore_pair/vstream_pair for that type in its
// simd_*.h; being no template, it is the one a call picks.
template <typename T>
inline void vstore_pair(T* p, V16 a, V16 b) {
  vstore(p, a);
  vstore(p + 16, b);
}
template <typename T>
inline void vstream_pair(T* p, V16 a, V16 b) {
  vstream(p, a);
  vstream(p + 16, b);
}

// One 64-byte line of a row from its groups: two for the 16-bit types (converted together
// where the instruction set can), one for float32.
template <bool kStream, typename T>
inline void store_line(T* p, const V16* groups) {
  if constexpr (sizeof(T) == 2) {
    if (kStream) {
      vstream_pair(p, groups[0], groups[1]);
    } else {
      vstore_pair(p, groups[0], groups[1]);
    }
  } else if (kStream) {
    vstream(p, groups[0]);
  } else {
    vstore(p, groups[0]);
  }
}

// Stores of bfloat16 outputs without looking for NaNs, on the paths with kBf16NumberStores (simd_*.h),
// for the tokens whose outputs can hold none (forward_kernel.h and backward_kernel.h say when). The
// rounding is the checked stores': the same bits.
template <typename T>
constexpr bool kNumberStores = std::is_same<T, BF16>::value && kBf16NumberStores;

template <typename F>
inline bool all_finite(const F* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(x[i])) return false;
  }
  return true;
}

// G consecutive groups, a line at a time; kNumbers: bfloat16 groups that hold no NaN (kNumberStores).
template <int G, bool kStream, bool kNumbers = false, typename T>
inline void store_groups(T* p, const V16* groups) {
  if constexpr (kNumbers) {
#pragma GCC unroll 8
    for (int g = 0; g < G; ++g) {
      if (kStream) {
        vstream_numbers(p + g * kLanes, groups[g]);
      } else {
        vstore_numbers(p + g * kLanes, groups[g]);
      }
    }
    return;
  }
  constexpr int kPerLine = sizeof(T) == 2 ? 2 : 1;
  int g = 0;
#pragma GCC unroll 8
  for (; g + kPerLine <= G; g += kPerLine) store_line<kStream>(p + g * kLanes, groups + g);
#pragma GCC unroll 8
  for (; g < G; ++g) {
    if (kStream) {
      vstream(p + g * kLanes, groups[g]);
    } else {
      vstore(p + g * kLanes, groups[g]);
    }
  }
}

// Both kernels prefetch, in pass 1, the value rows of the token a core takes up a block later,
// into L2, line by line beside the lines of the same rows they read: the next token's memory reads
// then overlap this token's arithmetic (pass 1's is the longer), and pass 1 reads several rows at
// once (kDotRows, kRunRows), so many memory streams are in flight. (The 16-bit forward leaves a
// third of those rows to its pass 2: forward_kernel.h, rows_prefetched_in_pass1.) Each measured
// fastest on an AVX-512 Xeon, on every path (docs/notes/kernel-variants.md). Both also touch
// each of those rows' first line a block earlier still: prefetch_row_starts.

// How many blocks ahead of the token a core reads the kernels touch each value row's first line:
// one block before the line-by-line prefetches of those rows begin (three measured no better,
// docs/notes/kernel-variants.md).
constexpr int64_t kRowStartBlocksAhead = 2;

// The first line of each value row of token t (kRowStartBlocksAhead blocks on), into L2. Measured on
// a Zen 4 host (docs/notes/kernel-variants.md): forward and backward from memory faster by up to
// 10-20% on one thread, and faster on two, though these lines are a sixty-fourth of the bytes. Most
// likely the address translations are what they bring early: a value row is a 4 KiB page of its own
// at H = 2048 in bfloat16 (two in float32), and a prefetch that must first walk the page tables
// starts its line late. No hardware counters on that host to prove it.
template <typename T>
inline void prefetch_row_starts(const T* block_res, const T* partial_block, int64_t t, int64_t rows, int64_t blocks,
                                int64_t hidden) {
  for (int64_t i = 0; i < rows; ++i) prefetch_l2(value_row(block_res, partial_block, t, i, blocks, hidden));
}

// body(std::integral_constant<int, size>{}) for 1 <= size <= K.
template <int K, typename Body>
inline void with_row_count(int64_t size, const Body& body) {
  if constexpr (K > 1) {
    if (size < K) return with_row_count<K - 1>(size, body);
  }
  body(std::integral_constant<int, K>{});
}

// Calls body(std::integral_constant<int, K>{}, i) for consecutive row groups [i, i + K) covering
// [0, row_num), each of at most kMaxRows rows and as even as they can be (9 rows, at most 4: 3, 3, 3),
// so that one instantiation per K serves any N.
template <int kMaxRows, typename Body>
inline void for_row_groups(int64_t row_num, const Body& body) {
  const int64_t groups = (row_num + kMaxRows - 1) / kMaxRows;
  int64_t i = 0;
  for (int64_t group = 0; group < groups; ++group) {
    const int64_t size = row_num / groups + (group < row_num % groups ? 1 : 0);
    with_row_count<kMaxRows>(size, [&](auto rows) { body(rows, i); });
    i += size;
  }
}

// A group of n < 16 elements (the tail at h = H) copied into group[16], zero padded.
template <typename T>
inline void copy_partial(const T* p, int64_t n, T* group) {
  std::memset(static_cast<void*>(group), 0, kLanes * sizeof(T));  // zero bits are +0.0 in every dtype
  std::memcpy(static_cast<void*>(group), p, static_cast<size_t>(n) * sizeof(T));
}

// A group of n < 16 elements: zero padded in, first n out.
template <typename T>
inline V16 vload_partial(const T* p, int64_t n) {
  T group[kLanes];
  copy_partial(p, n, group);
  return vload(group);
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
//   x_lanes += v[h] * x[h]   where x is v itself (kSquares) or a shared row x (the backward's go)
//   y_lanes += v[h] * w[h]   w: the score weight norm_weight * proj_weight, exact in float64
// in float64 lanes (D16): each addition rounds once in float64, so the per-token scalars these
// sums feed carry no float32 rounding. x and w are float64 rows (widened once per call or token,
// not per row) in the lane layout of T, zero padded to a multiple of 16.
template <bool kSquares, typename T>
inline void dot_lanes_1(const T* v, const double* x, const double* w, int64_t h0, int64_t h1, D16& x_lanes,
                        D16& y_lanes) {
  D16 xs = x_lanes, ys = y_lanes;  // locals, so that they stay in registers
  int64_t h = h0;
  for (; h + kLanes <= h1; h += kLanes) {
    const D16 value = widen(vload(v + h));
    xs = dfma(value, kSquares ? value : dload(x + h), xs);
    ys = dfma(value, dload(w + h), ys);
  }
  if (h < h1) {  // the last, partial group (h1 == H), zero padded
    const D16 value = widen(vload_partial(v + h, h1 - h));
    xs = dfma(value, kSquares ? value : dload(x + h), xs);
    ys = dfma(value, dload(w + h), ys);
  }
  x_lanes = xs;
  y_lanes = ys;
}

// The same for K rows at once, sharing the loads of x and w. Each row's lanes see exactly the
// operations dot_lanes_1 would apply, so the bits do not depend on K. kPrefetch: next_rows holds rows
// whose line at h each step prefetches into L2 (the same rows of the token a core takes up next; a
// null row is not prefetched); without it next_rows is unused. A template flag rather than a test of
// next_rows, as in add_runs: the test would come once per row and group. Out of line: measured faster
// so on avx2 (its float32 forward from cache 66-68 against 58-61 us), though llvm-mca models the two
// loops within 2 instructions of each other (docs/notes/kernel-variants.md).
template <int K, bool kSquares, bool kPrefetch, typename T>
[[gnu::noinline]] void dot_lanes_k(const T* const* rows, const double* x, const double* w, int64_t h0, int64_t h1,
                                   D16* x_lanes, D16* y_lanes, const T* const* next_rows) {
  D16 xs[K], ys[K];  // in registers as far as they fit, since every loop over r is unrolled
#pragma GCC unroll 16
  for (int r = 0; r < K; ++r) {
    xs[r] = x_lanes[r];
    ys[r] = y_lanes[r];
  }
  int64_t h = h0;
  for (; h + kLanes <= h1; h += kLanes) {
    const D16 wv = dload(w + h);
    D16 xv;
    if (!kSquares) xv = dload(x + h);
#pragma GCC unroll 16
    for (int r = 0; r < K; ++r) {
      if (kPrefetch && next_rows[r] != nullptr) prefetch_l2(next_rows[r] + h);
      const D16 v = widen(vload(rows[r] + h));
      xs[r] = dfma(v, kSquares ? v : xv, xs[r]);
      ys[r] = dfma(v, wv, ys[r]);
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < K; ++r) {
    x_lanes[r] = xs[r];
    y_lanes[r] = ys[r];
    if (h < h1) dot_lanes_1<kSquares>(rows[r], x, w, h, h1, x_lanes[r], y_lanes[r]);  // the partial group
  }
}

// Rows dot_lanes_k reads at once: four keep 16 float64 accumulators (32 registers of AVX-512,
// spilling on AVX2), and more rows at once were not faster (docs/notes/kernel-variants.md).
// One row at a time made AVX2's forward faster from cache and on one thread, but was not shown faster
// on two threads from memory, where the rows' streams count (docs/notes/kernel-variants.md).
constexpr int kDotRows = 4;

// Whether float32 rows are read interleaved: pass 1 walks H in chunks of kFloat32RowChunk elements,
// every group of rows over one chunk before the next chunk, so that all of a token's rows stream
// from memory together (the lanes go through memory between chunks); the forward's pass 2 then
// walks H backwards, from the lines pass 1 read last (still in L1). Measured faster on the 512-bit
// paths only (docs/notes/kernel-variants.md). Neither order changes any element's operations.
template <typename T>
constexpr bool kInterleavedRows = sizeof(T) == 4 && kFloat32RowChunk > 0;

// All rows of one token over [h0, h1), up to kDotRows at a time; next_rows (or null): rows to
// prefetch, next_rows[i] alongside rows[i].
template <bool kSquares, typename T>
inline void dot_lanes_rows(const T* const* rows, int64_t row_num, const double* x, const double* w, int64_t h0,
                           int64_t h1, D16* x_lanes, D16* y_lanes, const T* const* next_rows) {
  const int64_t chunk = kInterleavedRows<T> ? kFloat32RowChunk : h1 - h0;
  for (int64_t c0 = h0; c0 < h1; c0 += chunk) {
    const int64_t c1 = std::min(h1, c0 + chunk);
    for_row_groups<kDotRows>(row_num, [&](auto k, int64_t i) {
      constexpr int kRows = decltype(k)::value;
      if (next_rows != nullptr) {
        dot_lanes_k<kRows, kSquares, true>(rows + i, x, w, c0, c1, x_lanes + i, y_lanes + i, next_rows + i);
      } else {
        dot_lanes_k<kRows, kSquares, false>(rows + i, x, w, c0, c1, x_lanes + i, y_lanes + i, next_rows);
      }
    });
  }
}

// ---------------------------------------------------------------------------
// Pass 1 of the 16-bit types: float32 runs folded into the float64 lanes.
//
// A bfloat16 or float16 value has at most 11 significant bits and the score weight
// w = norm_weight * proj_weight at most 22, so w is a float32 value (checked per call: outside
// float32's range it need not be, and the call then sums as float32 inputs do). The products of
// two values (the forward's v*v, the backward's v*go) are then exact in float32, and so is v*w for
// bfloat16 (8 + 16 bits); float16's v*w rounds once, inside its fused multiply-add. The terms of a
// run of kRunGroups consecutive groups (runs at fixed places of H, carried across hidden tiles) are
// added lane by lane with float32 fused multiply-adds, and each run's sum is added into the float64
// lanes once: the float64 work drops from widening every value to widening one sum per run, for
// at most kRunGroups - 1 float32 roundings per lane and run. Where float32 may have lost more than
// that, a kernel sums the row again in float64 lanes (sum_row_in_float64): a sum that comes out
// non-finite (float32 overflow: values or products beyond 3.4e38), or one below kRunMinSum, where
// float32 subnormals (an error of up to 2^-150 per term) may have cost bits. Rows the runs sum
// exactly need not be summed again: a zero row's sums are zero. Runs of 32 groups against runs of 8,
// from memory: 0.86-0.96 of the forward's time, a median 0.92 of the backward's
// (docs/notes/kernel-variants.md).
constexpr int64_t kRunGroups = 32;
constexpr int64_t kRunElements = kRunGroups * kLanes;
constexpr double kRunMinSum = 0x1p-60;

// The float32 sums of one row's run in progress: of v*x (x = v itself in the forward) and v*w.
struct RunSums {
  V16 x, w;
};

// v * w + sum: bfloat16's v * w is exact in float32 (8 + 16 significant bits), float16's is not (11 + 22).
template <typename T>
inline V16 add_weight_term(V16 v, V16 w, V16 sum) {
  return std::is_same<T, BF16>::value ? vfma_exact_product(v, w, sum) : vfma(v, w, sum);
}

// The terms of kGroups full groups from h of kRows rows added to their runs' sums (add_runs), row by
// row: a sum the registers cannot hold goes through memory once for all kGroups terms.
template <int kRows, int kGroups, bool kSquares, typename T>
[[gnu::always_inline]] inline void add_group_terms(const T* const* rows, const T* x, const float* w, int64_t h,
                                                   V16* x_sums, V16* w_sums) {
  V16 wv[kGroups], xv[kGroups];
#pragma GCC unroll 2
  for (int g = 0; g < kGroups; ++g) {
    wv[g] = vload(w + h + g * kLanes);
    if (!kSquares) xv[g] = vload(x + h + g * kLanes);
  }
#pragma GCC unroll 16
  for (int r = 0; r < kRows; ++r) {
#pragma GCC unroll 2
    for (int g = 0; g < kGroups; ++g) {
      const V16 v = vload(rows[r] + h + g * kLanes);
      x_sums[r] = vfma_exact_product(v, kSquares ? v : xv[g], x_sums[r]);
      w_sums[r] = add_weight_term<T>(v, wv[g], w_sums[r]);
    }
  }
}

// Adds the terms of [h0, h1) (h0 a multiple of 16) of kRows rows to their runs, and each run that
// completes, or reaches H, to the rows' float64 lanes. x: the shared row of the sums with x (the
// backward's go, as T; unused with kSquares), w: the score weight as float32 in the lane layout of T.
// kPrefetch: next holds rows whose lines at h are prefetched (a null row is not), a 64-byte line (two
// groups) at a time; without it next is unused. The prefetch is a template flag, not a test of next,
// and the loop takes two groups a step, so that the prefetch's pointer loads and tests (AVX2 has 16
// general registers for 9 rows and 9 rows to prefetch) come once a line, not once a group. Out of line:
// inlined into the forward's task, GCC kept the 512-bit paths' run sums on the stack (docs/notes/kernel-variants.md).
template <int kRows, bool kSquares, bool kPrefetch, typename T>
[[gnu::noinline]] void add_runs(const T* const* rows, const T* x, const float* w, int64_t h0, int64_t h1,
                                int64_t hidden, RunSums* runs, D16* x_lanes, D16* w_lanes, const T* const* next) {
  static_assert(sizeof(T) == 2, "float32 runs are not built: 2 groups are one line of 16-bit values");
  const D16 one = widen(vset(1.0f));
  V16 x_sums[kRows], w_sums[kRows];  // in registers, since every loop over r is unrolled (else: the stack)
#pragma GCC unroll 16
  for (int r = 0; r < kRows; ++r) {
    x_sums[r] = runs[r].x;
    w_sums[r] = runs[r].w;
  }
  const auto add_group = [&](int64_t at) { add_group_terms<kRows, 1, kSquares>(rows, x, w, at, x_sums, w_sums); };
  const auto prefetch_line = [&](int64_t at) {
    if (kPrefetch) {
#pragma GCC unroll 16
      for (int r = 0; r < kRows; ++r) {
        if (next[r] != nullptr) prefetch_l2(next[r] + at);
      }
    }
  };
  for (int64_t h = h0; h < h1;) {
    const int64_t stop = std::min(h1, (h / kRunElements + 1) * kRunElements);
    if (h % (2 * kLanes) != 0 && h + kLanes <= stop) {  // a tile that starts in the middle of a line
      prefetch_line(h);
      add_group(h);
      h += kLanes;
    }
    for (; h + 2 * kLanes <= stop; h += 2 * kLanes) {
      prefetch_line(h);
      add_group_terms<kRows, 2, kSquares>(rows, x, w, h, x_sums, w_sums);
    }
    if (h + kLanes <= stop) {  // one group left before the tile's end or H
      prefetch_line(h);
      add_group(h);
      h += kLanes;
    }
    if (h < stop) {  // the last, partial group (stop == H), zero padded
      const V16 wv = vload(w + h);
      V16 xv;
      if (!kSquares) xv = vload_partial(x + h, stop - h);
#pragma GCC unroll 16
      for (int r = 0; r < kRows; ++r) {
        const V16 v = vload_partial(rows[r] + h, stop - h);
        x_sums[r] = vfma_exact_product(v, kSquares ? v : xv, x_sums[r]);
        w_sums[r] = add_weight_term<T>(v, wv, w_sums[r]);
      }
      h = stop;
    }
    if (h % kRunElements == 0 || h == hidden) {  // x * 1 + lanes: one float64 addition
#pragma GCC unroll 16
      for (int r = 0; r < kRows; ++r) {
        x_lanes[r] = dfma(widen(x_sums[r]), one, x_lanes[r]);
        w_lanes[r] = dfma(widen(w_sums[r]), one, w_lanes[r]);
        x_sums[r] = w_sums[r] = vzero();
      }
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < kRows; ++r) {
    runs[r].x = x_sums[r];
    runs[r].w = w_sums[r];
  }
}

// add_runs for all rows of one token over [h0, h1), up to kRunRows (simd_*.h) at a time.
template <bool kSquares, typename T>
inline void add_runs_rows(const T* const* rows, int64_t row_num, const T* x, const float* w, int64_t h0, int64_t h1,
                          int64_t hidden, RunSums* runs, D16* x_lanes, D16* w_lanes, const T* const* next) {
  for_row_groups<kRunRows>(row_num, [&](auto k, int64_t i) {
    constexpr int kRows = decltype(k)::value;
    if (next != nullptr) {
      add_runs<kRows, kSquares, true>(rows + i, x, w, h0, h1, hidden, runs + i, x_lanes + i, w_lanes + i, next + i);
    } else {
      add_runs<kRows, kSquares, false>(rows + i, x, w, h0, h1, hidden, runs + i, x_lanes + i, w_lanes + i, next);
    }
  });
}

// One row's two sums over all of H in float64 lanes, reduced (the runs' fallback). x, w as for
// dot_lanes_1.
template <bool kSquares, typename T>
inline void sum_row_in_float64(const T* row, const double* x, const double* w, int64_t hidden, double* x_sum,
                               double* w_sum) {
  D16 x_lanes = dzero(), w_lanes = dzero();
  dot_lanes_1<kSquares>(row, x, w, 0, hidden, x_lanes, w_lanes);
  *x_sum = lane_sum(x_lanes);
  *w_sum = lane_sum(w_lanes);
}

// Whether every element of a row is zero (either sign).
template <typename T>
inline bool is_zero_row(const T* row, int64_t hidden) {
  for (int64_t h = 0; h < hidden; ++h) {
    if constexpr (sizeof(T) == 2) {
      if ((row[h].bits & 0x7fffu) != 0) return false;
    } else if (row[h] != 0.0f) {
      return false;
    }
  }
  return true;
}

// A row of T as float32 in the lane layout of T, zero padded: [H_pad]
template <typename T>
inline void to_lane_layout(const T* row, int64_t hidden, float* out) {
  int64_t h = 0;
  for (; h + kLanes <= hidden; h += kLanes) vstore(out + h, vload(row + h));
  if (h < hidden) vstore(out + h, vload_partial(row + h, hidden - h));
}

// A row of T as float64 in the lane layout of T, zero padded: [H_pad]
template <typename T>
inline void to_wide_lane_layout(const T* row, int64_t hidden, double* out) {
  int64_t h = 0;
  for (; h + kLanes <= hidden; h += kLanes) dstore(out + h, widen(vload(row + h)));
  if (h < hidden) dstore(out + h, widen(vload_partial(row + h, hidden - h)));
}

// w[h] = norm_weight[h] * proj_weight[h], exact in float64, in the lane layout of T, zero padded:
// [H_pad] (the weight of the scores' sums).
template <typename T>
inline void wide_score_weight(const T* norm_weight, const T* proj_weight, int64_t hidden, double* w) {
  to_wide_lane_layout(norm_weight, hidden, w);
  for (int64_t h = 0; h < hidden; h += kLanes) {
    const int64_t n = std::min(kLanes, hidden - h);
    const D16 proj = widen(n == kLanes ? vload(proj_weight + h) : vload_partial(proj_weight + h, n));
    dstore(w + h, dfma(dload(w + h), proj, dzero()));
  }
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

// Whether the float32 score weight (score_weight) equals the exact one (wide_score_weight) in every
// element, padding included: then the 16-bit types' pass 1 may sum in float32 runs.
inline bool score_weight_is_float32(const float* w, const double* wide, int64_t hidden_pad) {
  for (int64_t h = 0; h < hidden_pad; ++h) {
    if (static_cast<double>(w[h]) != wide[h]) return false;
  }
  return true;
}

// A float32 row [H] in the lane layout of T (lane_element), zero padded: [H_pad]. The rows the loops
// combine with sources (loaded in that layout) must share it.
template <typename T>
inline void float_row_to_lane_layout(const float* row, int64_t hidden, float* out) {
  for (int64_t group = 0; group < padded_hidden(hidden); group += kLanes) {
    for (int lane = 0; lane < kLanes; ++lane) {
      const int64_t h = group + lane_element<T>(lane);
      out[group + lane] = h < hidden ? row[h] : 0.0f;
    }
  }
}

// The float64 lanes of sum_h a[h] * b[h] of two float rows (lane layout, zero padded), reduced.
inline double float_row_dot(const float* a, const float* b, int64_t hidden_pad) {
  D16 lanes = dzero();
  for (int64_t h = 0; h < hidden_pad; h += kLanes) lanes = dfma(widen(vload(a + h)), widen(vload(b + h)), lanes);
  return lane_sum(lanes);
}

// An RMSNorm's scale of a float row y (lane layout, zero padded to hidden_pad): 1 / sqrt(mean_h y^2 + eps),
// the mean from float64 lanes, rounded to float32 (the general read's and the normed update's output norm).
inline float inverse_rms(const float* y, int64_t hidden, int64_t hidden_pad, float eps) {
  const double mean_square = float_row_dot(y, y, hidden_pad) / static_cast<double>(hidden);
  return static_cast<float>(1.0 / std::sqrt(mean_square + static_cast<double>(eps)));
}

// out = (g * y) * rho from a float row y and a weight row g (both in the lane layout of T), or y itself
// when g is null, rounded once to T. kStream: full groups go by streaming stores (out 32-byte aligned,
// can_stream), so the output's lines are not read first.
template <bool kStream, typename T>
inline void store_normed_row(const float* y, const float* g, float rho, int64_t hidden, T* out) {
  const V16 rho_v = vset(rho);
  for (int64_t h = 0; h < hidden; h += kLanes) {
    V16 o = vload(y + h);
    if (g != nullptr) o = vmul(vmul(vload(g + h), o), rho_v);
    if (h + kLanes <= hidden) {
      if (kStream) {
        vstream(out + h, o);
      } else {
        vstore(out + h, o);
      }
    } else {
      vstore_partial(out + h, o, hidden - h);
    }
  }
}

// out[q][h .. h + 16G) = sum_i weights[q][i] * rows[i][h .. h + 16G) for Q weight rows: one fused multiply-add
// per row, rows in order (the same bits on every path). The rows are of T, loaded in its lane layout; the
// sums are float rows in that layout. (The general read's mix of its sources, prepare's numerators.)
template <int Q, int G, bool kStream, typename T>
inline void weighted_row_sums(const T* const* rows, int64_t row_num, const float* const* weights, int64_t h,
                              float* const* out) {
  V16 acc[Q][G];
#pragma GCC unroll 8
  for (int q = 0; q < Q; ++q) {
#pragma GCC unroll 8
    for (int g = 0; g < G; ++g) acc[q][g] = vzero();
  }
  for (int64_t i = 0; i < row_num; ++i) {
#pragma GCC unroll 8
    for (int g = 0; g < G; ++g) {
      const V16 v = vload(rows[i] + h + g * kLanes);
#pragma GCC unroll 8
      for (int q = 0; q < Q; ++q) acc[q][g] = vfma(vset(weights[q][i]), v, acc[q][g]);
    }
  }
#pragma GCC unroll 8
  for (int q = 0; q < Q; ++q) store_groups<G, kStream>(out[q] + h, acc[q]);
}

// The same sums for the last, partial group of n < 16 elements, into acc[Q] (zero past n): the caller
// stores them whole (a zero-padded row) or only their n elements.
template <int Q, typename T>
inline void weighted_row_sums_partial(const T* const* rows, int64_t row_num, const float* const* weights, int64_t h,
                                      int64_t n, V16* acc) {
  for (int q = 0; q < Q; ++q) acc[q] = vzero();
  for (int64_t i = 0; i < row_num; ++i) {
    const V16 v = vload_partial(rows[i] + h, n);
    for (int q = 0; q < Q; ++q) acc[q] = vfma(vset(weights[q][i]), v, acc[q]);
  }
}
