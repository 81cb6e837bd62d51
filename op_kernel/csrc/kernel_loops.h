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

// G consecutive groups, a line at a time.
template <int G, bool kStream, typename T>
inline void store_groups(T* p, const V16* groups) {
  constexpr int kPerLine = sizeof(T) == 2 ? 2 : 1;
  int g = 0;
  for (; g + kPerLine <= G; g += kPerLine) store_line<kStream>(p + g * kLanes, groups + g);
  for (; g < G; ++g) {
    if (kStream) {
      vstream(p + g * kLanes, groups[g]);
    } else {
      vstore(p + g * kLanes, groups[g]);
    }
  }
}

// Both kernels prefetch the value rows of the token a core takes up a block later, line by line
// beside its own, so that the next block's memory reads overlap this block's arithmetic: the
// 16-bit types in pass 1 (the longer pass, which converts every value to float64), float32 in
// pass 2. Each measured fastest on an AVX-512 Xeon (docs/kernels.md, performance notes).
template <typename T>
constexpr bool kPrefetchInPass1 = sizeof(T) == 2;

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
//   x_lanes += v[h] * x[h]   where x is v itself (kSquares) or a shared row x (the backward's go)
//   y_lanes += v[h] * w[h]   w: the score weight norm_weight * proj_weight, exact in float64
// in float64 lanes (D16): each addition rounds once in float64, so the per-token scalars these
// sums feed carry no float32 rounding. x and w are float64 rows (widened once per call or token,
// not per row) in the lane layout of T, zero padded to a multiple of 16.
// next_v (or null): a row whose line at h each step prefetches into L2 (the same row of a token
// taken up later, or this row further on), so that its memory reads overlap this pass's
// arithmetic. Into L2 only: the forward measured 2-4% faster so than into L1 (docs/kernels.md).
template <bool kSquares, typename T>
inline void dot_lanes_1(const T* v, const double* x, const double* w, int64_t h0, int64_t h1, D16& x_lanes,
                        D16& y_lanes, const T* next_v = nullptr) {
  D16 xs = x_lanes, ys = y_lanes;  // locals, so that they stay in registers
  int64_t h = h0;
  for (; h + kLanes <= h1; h += kLanes) {
    if (next_v != nullptr) prefetch_l2(next_v + h);
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

// The same for two rows a and b at once, sharing the loads of x and w. Each row's lanes see
// exactly the operations dot_lanes_1 would apply.
template <bool kSquares, typename T>
inline void dot_lanes_2(const T* a, const T* b, const double* x, const double* w, int64_t h0, int64_t h1, D16& xa,
                        D16& ya, D16& xb, D16& yb, const T* next_a = nullptr, const T* next_b = nullptr) {
  D16 xa_ = xa, ya_ = ya, xb_ = xb, yb_ = yb;
  int64_t h = h0;
  for (; h + kLanes <= h1; h += kLanes) {
    if (next_a != nullptr) {
      prefetch_l2(next_a + h);
      prefetch_l2(next_b + h);
    }
    const D16 va = widen(vload(a + h)), vb = widen(vload(b + h)), wv = dload(w + h);
    D16 xv;
    if (!kSquares) xv = dload(x + h);
    xa_ = dfma(va, kSquares ? va : xv, xa_);
    ya_ = dfma(va, wv, ya_);
    xb_ = dfma(vb, kSquares ? vb : xv, xb_);
    yb_ = dfma(vb, wv, yb_);
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

// All rows of one token over [h0, h1), two rows at a time; next_rows (or null): rows to prefetch,
// next_rows[i] alongside rows[i].
template <bool kSquares, typename T>
inline void dot_lanes_rows(const T* const* rows, int64_t row_num, const double* x, const double* w, int64_t h0,
                           int64_t h1, D16* x_lanes, D16* y_lanes, const T* const* next_rows = nullptr) {
  int64_t i = 0;
  for (; i + 2 <= row_num; i += 2) {
    dot_lanes_2<kSquares>(rows[i], rows[i + 1], x, w, h0, h1, x_lanes[i], y_lanes[i], x_lanes[i + 1],
                          y_lanes[i + 1], next_rows ? next_rows[i] : nullptr, next_rows ? next_rows[i + 1] : nullptr);
  }
  if (i < row_num) {
    dot_lanes_1<kSquares>(rows[i], x, w, h0, h1, x_lanes[i], y_lanes[i], next_rows ? next_rows[i] : nullptr);
  }
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

