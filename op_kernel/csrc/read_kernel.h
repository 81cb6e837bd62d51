// Native CPU kernels of BlockAttnResRead (the general read): S queries over the same L sources, per
// token; the formulas are op_kernel/block_attn_res_read.py's. Included by isa_*.cpp inside an
// instruction set's namespace, after its target pragma.
//
// With x_i source i's row of a token, q_s query s, w the key norm weight (or 1), qw_s = q_s * w
// (exact in float64), g_s the output norm weight's row of query s:
// forward, per token (a task is a chunk of kReadChunkTokens tokens):
//   pass 1: float64 lanes of sum x_i^2 and of the S dots <qw_s, x_i>, every row read from memory once
//           (the next token's rows prefetched meanwhile)  ->  r_i, z_{s,i}, softmax in float64
//   pass 2: y_s = sum_i c_{s,i} x_i (float32 fused multiply-adds, rows in order; c = p, or p r when the
//           values are normalised), rows still in cache; then out = y_s, or g_s y_s rho_s with rho_s
//           from the float64 lanes of sum y_s^2
// backward, per token:
//   pass 0 (output norm only): y_s recomputed as the forward's pass 2 did (the same coefficients from
//           the saved p and r: the same bits); gy_s = rho_s g_s go_s - y_s rho_s^3 / H <g_s go_s, y_s>
//   pass 1: float64 lanes of <gy_s, x_i> and <qw_s, x_i>  ->  per-row coefficients in float64
//   pass 2: grad x_i = sum_s (alpha_{s,i} qw_s + beta_{s,i} gy_s) - gamma_i x_i, and the chunk rows of
//           G_s += alpha_{s,i} x_i (tokens then rows in order) and of the output weight's gradient
// After the tasks the chunk rows are summed in chunk order (float64): the query's and the weights'
// gradients. Sums over H run in the 16 float64 lanes of every kernel here (attnres_native.h), so every
// path and thread count gives the same bits. No [T, L, H] temporary: per task only [S, H] rows.

namespace {

// Register blocks of pass 1 (rows x float64 query rows, each with its own lanes) and of the weighted
// sums (queries x groups of 16 elements); the bits do not depend on them. 2 x 3 on AVX-512: 12 of its
// 32 registers hold the dot lanes, 4 the squares, 4 the widened rows.
constexpr int kReadDotRows = 2;
constexpr int kReadDotQueries = 3;
// With one query row the block takes more rows (9 rows: 3 x 3): fewer walks over the query row and more
// rows read at once; measured ~8% faster at S = 1 (T = 4096, L = 9, H = 2048), slower with 3 queries.
constexpr int kReadDotRowsOneQuery = 4;
constexpr int kReadMixQueries = 3;
constexpr int kReadMixGroups = 2;

// The per-call rows derived from the weights, in the lane layout of T, zero padded to H_pad:
// qw_s = q_s * w exact in float64 (pass 1's dots) and rounded once to float32 (the backward's pass 2),
// and the output norm's weight rows.
template <typename T>
struct ReadWeights {
  int64_t hidden_pad;
  std::vector<double> wide;      // [S, H_pad]
  std::vector<float> narrow;     // [S, H_pad]
  std::vector<float> output;     // [W, H_pad]
  bool shared_output;            // W == 1: every query's output weight is row 0

  explicit ReadWeights(const ReadShape& a)
      : hidden_pad(padded_hidden(a.hidden)),
        wide(a.queries * hidden_pad),
        narrow(a.queries * hidden_pad),
        output(a.weight_rows * hidden_pad),
        shared_output(a.weight_rows == 1) {
    std::vector<float> query(hidden_pad), weight(hidden_pad, 1.0f);
    if (a.key_weight != nullptr) float_row_to_lane_layout<T>(a.key_weight, a.hidden, weight.data());
    for (int64_t s = 0; s < a.queries; ++s) {
      float_row_to_lane_layout<T>(a.query + s * a.hidden, a.hidden, query.data());
      for (int64_t h = 0; h < hidden_pad; ++h) {
        const double product = static_cast<double>(query[h]) * weight[h];  // exact: 24 + 24 bits
        wide[s * hidden_pad + h] = product;
        narrow[s * hidden_pad + h] = static_cast<float>(product);
      }
    }
    for (int64_t row = 0; row < a.weight_rows; ++row) {
      float_row_to_lane_layout<T>(a.output_weight + row * a.hidden, a.hidden, output.data() + row * hidden_pad);
    }
  }
  const double* wide_row(int64_t s) const { return wide.data() + s * hidden_pad; }
  const float* narrow_row(int64_t s) const { return narrow.data() + s * hidden_pad; }
  // The output weight row of query s: its own with W == S, else the shared one.
  const float* output_row(int64_t s) const { return output.data() + (shared_output ? 0 : s) * hidden_pad; }
};

// ---------------------------------------------------------------------------
// Pass 1: float64 lanes of rows against float64 query rows.

// The terms of one group of K rows (widened) against Q query rows at h.
template <int K, int Q, bool kSquares>
[[gnu::always_inline]] inline void add_read_terms(const D16* v, const double* const* queries, int64_t h, D16* sq,
                                                  D16 (*acc)[K]) {
#pragma GCC unroll 8
  for (int r = 0; r < K; ++r) {
    if (kSquares) sq[r] = dfma(v[r], v[r], sq[r]);
  }
#pragma GCC unroll 8
  for (int q = 0; q < Q; ++q) {
    const D16 query = dload(queries[q] + h);
#pragma GCC unroll 8
    for (int r = 0; r < K; ++r) acc[q][r] = dfma(v[r], query, acc[q][r]);
  }
}

// Over all of H, the lanes of K rows' dots with Q query rows (lane layout of T, zero padded), into
// dots[q * dot_stride + r], and with kSquares of the rows' sums of squares, into squares[r]. kPrefetch:
// the line at h of each next[r] (the row of the token the task takes up next; null: none) goes to L2.
// Out of line, so that the register block is allocated for this loop alone.
template <int K, int Q, bool kSquares, bool kPrefetch, typename T>
[[gnu::noinline]] void row_query_lanes(const T* const* rows, const double* const* queries, int64_t hidden,
                                       D16* squares, D16* dots, int64_t dot_stride, const T* const* next) {
  D16 sq[K], acc[Q][K], v[K];
#pragma GCC unroll 8
  for (int r = 0; r < K; ++r) {
    sq[r] = dzero();
#pragma GCC unroll 8
    for (int q = 0; q < Q; ++q) acc[q][r] = dzero();
  }
  int64_t h = 0;
  for (; h + kLanes <= hidden; h += kLanes) {
#pragma GCC unroll 8
    for (int r = 0; r < K; ++r) {
      if (kPrefetch && next[r] != nullptr) prefetch_l2(next[r] + h);
      v[r] = widen(vload(rows[r] + h));
    }
    add_read_terms<K, Q, kSquares>(v, queries, h, sq, acc);
  }
  if (h < hidden) {  // the last, partial group, zero padded as the query rows are
#pragma GCC unroll 8
    for (int r = 0; r < K; ++r) v[r] = widen(vload_partial(rows[r] + h, hidden - h));
    add_read_terms<K, Q, kSquares>(v, queries, h, sq, acc);
  }
#pragma GCC unroll 8
  for (int r = 0; r < K; ++r) {
    if (kSquares) squares[r] = sq[r];
#pragma GCC unroll 8
    for (int q = 0; q < Q; ++q) dots[q * dot_stride + r] = acc[q][r];
  }
}

// One token's lanes: every row against every query row, dots [query_num, row_num]; with kSquares the
// rows' squares [row_num] too, taken (and the next token's rows prefetched) with the first query block.
// Row blocks of at most kRows rows.
template <int kRows, bool kSquares, typename T>
inline void token_lanes_in_blocks(const T* const* rows, int64_t row_num, const double* const* queries,
                                  int64_t query_num, int64_t hidden, D16* squares, D16* dots, const T* const* next) {
  for_row_groups<kRows>(row_num, [&](auto k, int64_t r) {
    for_row_groups<kReadDotQueries>(query_num, [&](auto q, int64_t s) {
      constexpr int kK = decltype(k)::value, kQ = decltype(q)::value;
      D16* block = dots + s * row_num + r;
      D16* row_squares = kSquares ? squares + r : nullptr;  // the backward has none
      if (s == 0 && next != nullptr) {
        row_query_lanes<kK, kQ, kSquares, true>(rows + r, queries + s, hidden, row_squares, block, row_num, next + r);
      } else if (s == 0) {
        row_query_lanes<kK, kQ, kSquares, false>(rows + r, queries + s, hidden, row_squares, block, row_num, next);
      } else {
        row_query_lanes<kK, kQ, false, false>(rows + r, queries + s, hidden, squares, block, row_num, next);
      }
    });
  });
}

template <bool kSquares, typename T>
inline void token_lanes(const T* const* rows, int64_t row_num, const double* const* queries, int64_t query_num,
                        int64_t hidden, D16* squares, D16* dots, const T* const* next) {
  if (query_num == 1) {
    token_lanes_in_blocks<kReadDotRowsOneQuery, kSquares>(rows, row_num, queries, query_num, hidden, squares, dots,
                                                         next);
  } else {
    token_lanes_in_blocks<kReadDotRows, kSquares>(rows, row_num, queries, query_num, hidden, squares, dots, next);
  }
}

// ---------------------------------------------------------------------------
// The weighted sums y_s = sum_i c_{s,i} x_i (forward pass 2, backward pass 0).

// y_s for every query: c [S, L] coefficients, y [S, H_pad] float rows in the lane layout of T.
template <typename T>
inline void mix_rows(const T* const* rows, int64_t row_num, const float* c, int64_t query_num, int64_t hidden,
                     float* y) {
  const int64_t hidden_pad = padded_hidden(hidden);
  for_row_groups<kReadMixQueries>(query_num, [&](auto q, int64_t s) {
    constexpr int kQ = decltype(q)::value;
    const float* block_c[kQ];
    float* block_y[kQ];
    for (int j = 0; j < kQ; ++j) {
      block_c[j] = c + (s + j) * row_num;
      block_y[j] = y + (s + j) * hidden_pad;
    }
    constexpr int64_t kStep = kReadMixGroups * kLanes;
    int64_t h = 0;
    for (; h + kStep <= hidden; h += kStep) {
      weighted_row_sums<kQ, kReadMixGroups, false>(rows, row_num, block_c, h, block_y);
    }
    for (; h + kLanes <= hidden; h += kLanes) weighted_row_sums<kQ, 1, false>(rows, row_num, block_c, h, block_y);
    if (h < hidden) {  // the partial group stored whole: y's padding is zero, as inverse_rms needs
      V16 acc[kQ];
      weighted_row_sums_partial<kQ>(rows, row_num, block_c, h, hidden - h, acc);
      for (int j = 0; j < kQ; ++j) vstore(block_y[j] + h, acc[j]);
    }
  });
}

// The mixing coefficients of one query from its float32 probabilities and inverse norms, as stored:
// the forward and the backward's recomputation of y use the same ones, so y has the same bits in both.
inline void mix_coefficients(const float* p, const float* r, int64_t row_num, bool normalize_values, float* c) {
  for (int64_t i = 0; i < row_num; ++i) {
    c[i] = normalize_values ? static_cast<float>(static_cast<double>(p[i]) * r[i]) : p[i];
  }
}

// ---------------------------------------------------------------------------
// Forward.

// inv_norm [L], probs [S, L] and the mixing coefficients [S, L] of one token from its reduced sums
// (squares [L], dots [S, L]); scalar float64 code until stored: a score is about sqrt(H) in size, and its
// float32 rounding would move a peaked softmax. r, scores: [L] scratch.
inline void read_softmax(const ReadShape& a, const double* squares, const double* dots, float* inv_norm, float* probs,
                         float* coefficients, double* r, double* scores) {
  const int64_t rows = a.rows;
  for (int64_t i = 0; i < rows; ++i) {
    r[i] = 1.0 / std::sqrt(squares[i] / static_cast<double>(a.hidden) + static_cast<double>(a.eps));
    inv_norm[i] = static_cast<float>(r[i]);
  }
  for (int64_t s = 0; s < a.queries; ++s) {
    double top = -INFINITY;
    for (int64_t i = 0; i < rows; ++i) {
      scores[i] = static_cast<double>(a.scale) * r[i] * dots[s * rows + i];
      if (scores[i] > top) top = scores[i];
    }
    double total = 0.0;  // rows in order
    for (int64_t i = 0; i < rows; ++i) {
      scores[i] = std::exp(scores[i] - top);  // the C library's exp: the same call on every path
      total += scores[i];
    }
    float* p = probs + s * rows;
    for (int64_t i = 0; i < rows; ++i) p[i] = static_cast<float>(scores[i] / total);
    mix_coefficients(p, inv_norm, rows, a.normalize_values, coefficients + s * rows);
  }
}

// out[s, t] from y_s (lane layout): y_s itself, or with an output norm g_s y_s rho_s, rho_s from the
// float64 lanes of sum y_s^2. Returns rho_s (0 without an output norm). kStream: full groups go by
// streaming stores (out 32-byte aligned, can_stream), so the output's lines are not read first.
template <bool kStream, typename T>
inline float finish_output(const ReadShape& a, const ReadWeights<T>& weights, int64_t s, const float* y, T* out) {
  if (!a.output_norm()) {
    store_normed_row<kStream>(y, nullptr, 0.0f, a.hidden, out);
    return 0.0f;
  }
  const float rho = inverse_rms(y, a.hidden, weights.hidden_pad, a.output_eps);
  store_normed_row<kStream>(y, weights.output_row(s), rho, a.hidden, out);
  return rho;
}

// Whether the forward writes its output by streaming stores: when it can (aligned rows) and the output
// is far larger than the caches (stream_stores: the bindings' threshold, the other ops' too), where the
// usual stores would first read every line of it from memory (a third more traffic at S = 3). The
// stores' values are the same: the same bits.
template <typename T>
inline bool stream_output(const ReadForwardArgs& a) {
  return a.stream_stores && can_stream<T>(a.out, a.hidden);
}

// A forward task's scratch: per token [L] and [S, L] scalars, the lanes, and y [S, H_pad].
template <typename T>
struct ReadForwardTask {
  const ReadForwardArgs& a;
  const ReadWeights<T>& weights;
  std::vector<const T*> rows, next;
  std::vector<const double*> queries;
  LaneArray square_lanes, dot_lanes;
  std::vector<double> squares, dots, r, scores;
  std::vector<float> inv_norm, probs, coefficients, y;
  bool stream;  // the output by streaming stores (stream_output)

  ReadForwardTask(const ReadForwardArgs& args, const ReadWeights<T>& w)
      : a(args),
        weights(w),
        rows(args.rows),
        next(args.rows),
        queries(args.queries),
        square_lanes(args.rows),
        dot_lanes(args.queries * args.rows),
        squares(args.rows),
        dots(args.queries * args.rows),
        r(args.rows),
        scores(args.rows),
        inv_norm(args.rows),
        probs(args.queries * args.rows),
        coefficients(args.queries * args.rows),
        y(args.queries * w.hidden_pad),
        stream(stream_output<T>(args)) {
    for (int64_t s = 0; s < a.queries; ++s) queries[s] = weights.wide_row(s);
  }

  void token(int64_t t, bool has_next) {
    for (int64_t i = 0; i < a.rows; ++i) {
      rows[i] = static_cast<const T*>(a.source_row(i, t));
      next[i] = has_next ? static_cast<const T*>(a.source_row(i, t + 1)) : nullptr;
    }
    token_lanes<true>(rows.data(), a.rows, queries.data(), a.queries, a.hidden, square_lanes.data(), dot_lanes.data(),
                      has_next ? next.data() : nullptr);
    for (int64_t i = 0; i < a.rows; ++i) squares[i] = lane_sum(square_lanes[i]);
    for (int64_t j = 0; j < a.queries * a.rows; ++j) dots[j] = lane_sum(dot_lanes[j]);
    read_softmax(a, squares.data(), dots.data(), inv_norm.data(), probs.data(), coefficients.data(), r.data(),
                 scores.data());
    mix_rows(rows.data(), a.rows, coefficients.data(), a.queries, a.hidden, y.data());
    T* out = static_cast<T*>(a.out);
    for (int64_t s = 0; s < a.queries; ++s) {
      const float* ys = y.data() + s * weights.hidden_pad;
      T* out_row = out + (s * a.tokens + t) * a.hidden;
      const float rho = stream ? finish_output<true>(a, weights, s, ys, out_row)
                               : finish_output<false>(a, weights, s, ys, out_row);
      if (a.output_inv_rms != nullptr) a.output_inv_rms[s * a.tokens + t] = rho;
    }
    store_statistics(t);
  }

  void store_statistics(int64_t t) {
    if (a.inv_norm != nullptr) std::memcpy(a.inv_norm + t * a.rows, inv_norm.data(), a.rows * sizeof(float));
    if (a.probs == nullptr) return;
    for (int64_t s = 0; s < a.queries; ++s) {
      std::memcpy(a.probs + (s * a.tokens + t) * a.rows, probs.data() + s * a.rows, a.rows * sizeof(float));
    }
  }
};

template <typename T>
void read_forward_impl(const ReadForwardArgs& args, int max_threads) {
  const ReadWeights<T> weights(args);
  const int64_t chunks = (args.tokens + kReadChunkTokens - 1) / kReadChunkTokens;
  parallel_tasks(chunks, max_threads, [&](int64_t chunk) {
    ReadForwardTask<T> task(args, weights);
    const int64_t start = chunk * kReadChunkTokens, stop = std::min(start + kReadChunkTokens, args.tokens);
    for (int64_t t = start; t < stop; ++t) task.token(t, t + 1 < stop);
    if (task.stream) stream_fence();  // the task's streaming stores are visible when the call returns
  });
}

// ---------------------------------------------------------------------------
// Backward.

// gy_s = rho_s g_s go_s - y_s rho_s^3 / H <g_s go_s, y_s> (rows in lane layout; gy may be go itself),
// and the output weight's chunk row += go_s y_s rho_s.
inline void output_norm_gradient(const float* g, const float* go, const float* y, float rho, int64_t hidden,
                                 float* gy, float* weight_row) {
  const int64_t hidden_pad = padded_hidden(hidden);
  D16 lanes = dzero();  // <g go, y>
  for (int64_t h = 0; h < hidden_pad; h += kLanes) {
    lanes = dfma(widen(vmul(vload(g + h), vload(go + h))), widen(vload(y + h)), lanes);
  }
  const double r = rho;
  const V16 rho_v = vset(rho), neg_k = vset(static_cast<float>(-r * r * r / static_cast<double>(hidden) * lane_sum(lanes)));
  for (int64_t h = 0; h < hidden_pad; h += kLanes) {
    const V16 go_v = vload(go + h), y_v = vload(y + h);
    vstore(weight_row + h, vfma(rho_v, vmul(go_v, y_v), vload(weight_row + h)));
    vstore(gy + h, vfma(neg_k, y_v, vmul(rho_v, vmul(vload(g + h), go_v))));
  }
}

// Pass 2's coefficients of one token, float64 until stored, from b_{s,i} = <gy_s, x_i> and
// d_{s,i} = <qw_s, x_i> ([S, L] each), p [S, L], r [L]:
//   a = b (raw values) or b r,  dz = scale p (a - sum_j p_j a_j)
//   alpha_{s,i} = dz r,  beta_{s,i} = p (raw) or p r,  gamma_i = r^3 / H (sum_s dz d + c_i),
//   c_i = 0 (raw) or sum_s p b
// alpha and beta [L, S] (a row's queries side by side, as pass 2 reads them), gamma [L]; sums: [L] scratch.
inline void gradient_coefficients(const ReadShape& a, const double* b, const double* d, const float* p,
                                  const float* r, float* alpha, float* beta, float* gamma, double* sums) {
  const int64_t rows = a.rows, queries = a.queries;
  for (int64_t i = 0; i < rows; ++i) sums[i] = 0.0;
  for (int64_t s = 0; s < queries; ++s) {
    const double* bs = b + s * rows;
    const float* ps = p + s * rows;
    double pa = 0.0;  // sum_j p_j a_j, rows in order
    for (int64_t i = 0; i < rows; ++i) pa += ps[i] * (a.normalize_values ? bs[i] * r[i] : bs[i]);
    for (int64_t i = 0; i < rows; ++i) {
      const double ai = a.normalize_values ? bs[i] * r[i] : bs[i];
      const double dz = static_cast<double>(a.scale) * ps[i] * (ai - pa);
      alpha[i * queries + s] = static_cast<float>(dz * r[i]);
      beta[i * queries + s] = a.normalize_values ? static_cast<float>(static_cast<double>(ps[i]) * r[i]) : ps[i];
      sums[i] += dz * d[s * rows + i] + (a.normalize_values ? ps[i] * bs[i] : 0.0);
    }
  }
  for (int64_t i = 0; i < rows; ++i) {
    const double ri = r[i];
    gamma[i] = static_cast<float>(ri * ri * ri / static_cast<double>(a.hidden) * sums[i]);
  }
}

// Pass 2 of one row: grad[h] = -gamma x[h] + sum_s (alpha_s qw_s[h] + beta_s gy_s[h]) into the row's
// gradient (T), and G_s[h] += alpha_s x[h] into the chunk rows. qw, gy, g_rows: [S, H_pad] float rows.
template <typename T>
inline void row_gradient(const T* x, T* grad, int64_t hidden, int64_t queries, const float* alpha, const float* beta,
                         float gamma, const float* qw, const float* gy, float* g_rows) {
  const int64_t hidden_pad = padded_hidden(hidden);
  const V16 neg_gamma = vset(-gamma);
  for (int64_t h = 0; h < hidden; h += kLanes) {
    const int64_t n = std::min(kLanes, hidden - h);
    const V16 v = n == kLanes ? vload(x + h) : vload_partial(x + h, n);
    V16 acc = vmul(neg_gamma, v);
    for (int64_t s = 0; s < queries; ++s) {
      const int64_t e = s * hidden_pad + h;
      const V16 alpha_v = vset(alpha[s]);
      acc = vfma(alpha_v, vload(qw + e), acc);
      acc = vfma(vset(beta[s]), vload(gy + e), acc);
      vstore(g_rows + e, vfma(alpha_v, v, vload(g_rows + e)));
    }
    if (n == kLanes) {
      vstore(grad + h, acc);
    } else {
      vstore_partial(grad + h, acc, n);
    }
  }
}

// A backward task's scratch and its chunk rows: G [S, H_pad] and the output weight's [W, H_pad].
template <typename T>
struct ReadBackwardTask {
  const ReadBackwardArgs& a;
  const ReadWeights<T>& weights;
  int64_t hidden_pad;
  std::vector<const T*> rows, next;
  std::vector<const double*> queries;  // [2S]: gy_s widened, then qw_s
  LaneArray dot_lanes;                 // [2S, L]
  std::vector<double> dots, sums;      // [2S, L], [L]
  std::vector<float> p, coefficients, alpha, beta, gamma;  // [S, L], [S, L], [L, S], [L, S], [L]
  std::vector<float> go, y, gy, g_rows, weight_rows;       // [S, H_pad] x 4, [W, H_pad]
  std::vector<double> gy_wide;                              // [S, H_pad]

  ReadBackwardTask(const ReadBackwardArgs& args, const ReadWeights<T>& w)
      : a(args), weights(w), hidden_pad(w.hidden_pad), rows(args.rows), next(args.rows), queries(2 * args.queries),
        dot_lanes(2 * args.queries * args.rows), dots(2 * args.queries * args.rows), sums(args.rows),
        p(args.queries * args.rows), coefficients(args.queries * args.rows), alpha(args.queries * args.rows),
        beta(args.queries * args.rows), gamma(args.rows), go(args.queries * hidden_pad), y(args.queries * hidden_pad),
        gy(args.queries * hidden_pad), g_rows(args.queries * hidden_pad), weight_rows(args.weight_rows * hidden_pad),
        gy_wide(args.queries * hidden_pad) {
    for (int64_t s = 0; s < a.queries; ++s) {
      queries[s] = gy_wide.data() + s * hidden_pad;
      queries[a.queries + s] = weights.wide_row(s);
    }
  }

  void start_chunk() {
    std::fill(g_rows.begin(), g_rows.end(), 0.0f);
    std::fill(weight_rows.begin(), weight_rows.end(), 0.0f);
  }

  // gy_s of token t (and its terms of the output weight's chunk row): go itself without an output norm.
  void output_gradients(int64_t t) {
    const T* grad_out = static_cast<const T*>(a.grad_out);
    for (int64_t s = 0; s < a.queries; ++s) {
      to_lane_layout(grad_out + (s * a.tokens + t) * a.hidden, a.hidden, go.data() + s * hidden_pad);
    }
    if (!a.output_norm()) {
      gy = go;
      return;
    }
    for (int64_t s = 0; s < a.queries; ++s) mix_coefficients(p.data() + s * a.rows, a.inv_norm + t * a.rows, a.rows,
                                                             a.normalize_values, coefficients.data() + s * a.rows);
    mix_rows(rows.data(), a.rows, coefficients.data(), a.queries, a.hidden, y.data());
    const bool shared = a.weight_rows == 1;
    for (int64_t s = 0; s < a.queries; ++s) {
      const int64_t e = s * hidden_pad;
      output_norm_gradient(weights.output_row(s), go.data() + e, y.data() + e, a.output_inv_rms[s * a.tokens + t],
                           a.hidden, gy.data() + e, weight_rows.data() + (shared ? 0 : e));
    }
  }

  void token(int64_t t, bool has_next) {
    for (int64_t i = 0; i < a.rows; ++i) {
      rows[i] = static_cast<const T*>(a.source_row(i, t));
      next[i] = has_next ? static_cast<const T*>(a.source_row(i, t + 1)) : nullptr;
    }
    for (int64_t s = 0; s < a.queries; ++s) {
      std::memcpy(p.data() + s * a.rows, a.probs + (s * a.tokens + t) * a.rows, a.rows * sizeof(float));
    }
    output_gradients(t);
    for (int64_t j = 0; j < a.queries * hidden_pad; ++j) gy_wide[j] = gy[j];
    token_lanes<false>(rows.data(), a.rows, queries.data(), 2 * a.queries, a.hidden, nullptr, dot_lanes.data(),
                       has_next ? next.data() : nullptr);
    for (int64_t j = 0; j < 2 * a.queries * a.rows; ++j) dots[j] = lane_sum(dot_lanes[j]);
    const float* r = a.inv_norm + t * a.rows;
    gradient_coefficients(a, dots.data(), dots.data() + a.queries * a.rows, p.data(), r, alpha.data(), beta.data(),
                          gamma.data(), sums.data());
    for (int64_t i = 0; i < a.rows; ++i) {
      T* grad = static_cast<T*>(a.grad_sources[i]) + t * a.hidden;
      row_gradient(rows[i], grad, a.hidden, a.queries, alpha.data() + i * a.queries, beta.data() + i * a.queries,
                   gamma[i], weights.narrow.data(), gy.data(), g_rows.data());
    }
  }

  // The chunk's rows, in natural order, into the workspace: G at [S, H], then the output weight's at [W, H].
  void end_chunk(float* workspace) const {
    for (int64_t s = 0; s < a.queries; ++s) {
      from_lane_layout<T>(g_rows.data() + s * hidden_pad, a.hidden, workspace + s * a.hidden);
    }
    for (int64_t row = 0; row < a.weight_rows; ++row) {
      from_lane_layout<T>(weight_rows.data() + row * hidden_pad, a.hidden, workspace + (a.queries + row) * a.hidden);
    }
  }
};

// The query's and the weights' gradients from the chunk rows ([chunks, S + W, H]), summed in chunk order
// in float64, columns split over the threads: grad_query[s] = w G_s, grad_key_weight = sum_s q_s G_s.
inline void sum_chunk_rows(const ReadBackwardArgs& a, const float* workspace, int64_t chunks, int max_threads) {
  constexpr int64_t kColumns = 256;
  const int64_t row_num = a.queries + a.weight_rows, hidden = a.hidden;
  const int64_t column_blocks = (hidden + kColumns - 1) / kColumns;
  parallel_tasks(column_blocks, chunks > 1 ? max_threads : 1, [&](int64_t block) {
    const int64_t h0 = block * kColumns, width = std::min(kColumns, hidden - h0);
    std::vector<double> sums(row_num * kColumns, 0.0);
    for (int64_t chunk = 0; chunk < chunks; ++chunk) {
      for (int64_t row = 0; row < row_num; ++row) {
        const float* source = workspace + (chunk * row_num + row) * hidden + h0;
        for (int64_t j = 0; j < width; ++j) sums[row * kColumns + j] += source[j];
      }
    }
    for (int64_t j = 0; j < width; ++j) {
      const int64_t h = h0 + j;
      const double w = a.key_weight != nullptr ? a.key_weight[h] : 1.0;
      double key = 0.0;  // queries in order
      for (int64_t s = 0; s < a.queries; ++s) {
        const double g = sums[s * kColumns + j];
        a.grad_query[s * hidden + h] = static_cast<float>(w * g);
        key += static_cast<double>(a.query[s * hidden + h]) * g;
      }
      if (a.grad_key_weight != nullptr) a.grad_key_weight[h] = static_cast<float>(key);
      for (int64_t row = 0; row < a.weight_rows; ++row) {
        a.grad_output_weight[row * hidden + h] = static_cast<float>(sums[(a.queries + row) * kColumns + j]);
      }
    }
  });
}

template <typename T>
void read_backward_impl(const ReadBackwardArgs& args, int max_threads) {
  const ReadWeights<T> weights(args);
  const int64_t chunks = (args.tokens + kReadChunkTokens - 1) / kReadChunkTokens;
  const int64_t chunk_floats = (args.queries + args.weight_rows) * args.hidden;
  // One workspace row per chunk and summed row: chunk rows are tokens' sums in token order, whichever
  // thread takes the chunk. With no tokens the one zero chunk gives zero gradients.
  std::vector<float> workspace(std::max<int64_t>(chunks, 1) * chunk_floats, 0.0f);
  parallel_tasks(chunks, max_threads, [&](int64_t chunk) {
    ReadBackwardTask<T> task(args, weights);
    task.start_chunk();
    const int64_t start = chunk * kReadChunkTokens, stop = std::min(start + kReadChunkTokens, args.tokens);
    for (int64_t t = start; t < stop; ++t) task.token(t, t + 1 < stop);
    task.end_chunk(workspace.data() + chunk * chunk_floats);
  });
  sum_chunk_rows(args, workspace.data(), std::max<int64_t>(chunks, 1), max_threads);
}

}  // namespace

void read_forward(const ReadForwardArgs& args, int max_threads) {
  switch (args.dtype) {
    case DType::kFloat32:
      return read_forward_impl<float>(args, max_threads);
    case DType::kFloat16:
      return read_forward_impl<FP16>(args, max_threads);
    case DType::kBFloat16:
      return read_forward_impl<BF16>(args, max_threads);
  }
}

void read_backward(const ReadBackwardArgs& args, int max_threads) {
  switch (args.dtype) {
    case DType::kFloat32:
      return read_backward_impl<float>(args, max_threads);
    case DType::kFloat16:
      return read_backward_impl<FP16>(args, max_threads);
    case DType::kBFloat16:
      return read_backward_impl<BF16>(args, max_threads);
  }
}
