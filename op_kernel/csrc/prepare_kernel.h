// Native CPU kernel of BlockAttnResPrepare (phase 1 of the two-phase read), executing a
// PrepareTilingData. Included by isa_*.cpp inside an instruction set's namespace, after its target pragma.
//
// For each token, the Nv = min(valid_blocks, N) snapshot rows are scored against all S pseudo-queries:
// a small matrix product per token, so each row is read from memory once for every query. Per core
// of the tiling (a task), token by token, per group of `query_tile` queries:
//   pass 1 over the hidden tiles: the float64 lanes of each row's sum of squares and of its dot with
//          each query, kPrepareDotRows rows against kPrepareDotQueries queries per load, one register's
//          worth of lanes (DPart) at a time
//   per query, scalar float64: norms, logits, their max, exps (the C library's exp), their sum in
//          row order: logit_max and exp_sum
//   pass 2 over the hidden tiles: numerator = sum_n exp_n * row_n in float32 fused multiply-adds, rows
//          in order (as the forward's weighted sum), kPrepareSumQueries queries per load of a row
// A token's rows are contiguous; with one hidden tile and one query group (the usual tiling), pass 2
// reads them from cache. The bits depend on none of the blocks, tiles, groups, cores or instruction
// sets (attnres_native.h). valid_blocks is read when the kernel runs: a new count needs no new record.

namespace {

constexpr float kLowestFloat32 = -0x1.fffffep127f;  // the empty state's logit_max

static_assert(sizeof(D16) == kLanes * sizeof(double), "a D16 is its 16 lanes in order");
constexpr int kDotParts = static_cast<int>(kLanes) / kDotPartLanes;  // sweeps of a group's lanes

// The float64 pseudo-queries in pass 1's order: for each group of 16 elements, for each part of its lanes
// (kDotPartLanes lanes, kDotParts parts), the S queries' lanes one after the other,
// [D_pad / 16][kDotParts][S][kDotPartLanes]. A block of queries at one group and part is then one
// pointer and fixed offsets, and the next group's is a fixed stride on: the inner loop holds no pointer
// per query (with one per query the register blocks left too few registers for the pointers).
// A PhasedRow, 1 KiB from value_rows' page offset (the block_res rows pass 1 reads beside it): as a
// std::vector (malloc aligns to 16 bytes) the avx2 prepare ran 12-18% slower from cache.
class PartQueries {
 public:
  PartQueries(const float* pseudo_query, int64_t queries, int64_t hidden, const void* value_rows)
      : queries_(queries), lanes_(queries * padded_hidden(hidden), value_rows, 1024) {
    std::vector<double> wide(padded_hidden(hidden));
    for (int64_t s = 0; s < queries; ++s) {
      to_wide_lane_layout(pseudo_query + s * hidden, hidden, wide.data());
      for (int64_t h = 0; h < padded_hidden(hidden); h += kLanes) {
        for (int part = 0; part < kDotParts; ++part) {
          std::memcpy(lanes_.data() + offset(h / kLanes, part, s), wide.data() + h + part * kDotPartLanes,
                      kDotPartLanes * sizeof(double));
        }
      }
    }
  }
  // Query s's lanes of `part` at the group holding element h (h % 16 == 0).
  const double* at(int64_t h, int part, int64_t s) const { return lanes_.data() + offset(h / kLanes, part, s); }
  int64_t group_stride() const { return kDotParts * queries_ * kDotPartLanes; }

 private:
  int64_t offset(int64_t group, int part, int64_t s) const {
    return ((group * kDotParts + part) * queries_ + s) * kDotPartLanes;
  }

  int64_t queries_;
  PhasedRow<double> lanes_;
};

// One part of a group: K rows (v, widened) into their squares (kSquares) and their dots with Q queries,
// query q's lanes at query + q * kDotPartLanes. Always inlined: as a call, its register block would
// go through memory on every group (GCC 12 left it a call on avx2, at twice the time).
template <int K, int Q, bool kSquares>
[[gnu::always_inline]] inline void add_dot_part(const DPart* v, const double* query, DPart* sq, DPart (*acc)[K]) {
#pragma GCC unroll 8
  for (int r = 0; r < K; ++r) {
    if (kSquares) sq[r] = dpart_fma(v[r], v[r], sq[r]);
  }
#pragma GCC unroll 8
  for (int q = 0; q < Q; ++q) {
    const DPart lanes = dpart_load(query + q * kDotPartLanes);
#pragma GCC unroll 8
    for (int r = 0; r < K; ++r) acc[q][r] = dpart_fma(v[r], lanes, acc[q][r]);
  }
}

// Where a block of K rows x Q queries keeps its float64 lanes between chunks: row r's squares at
// squares[r], its dot with query q at dots[q * dot_stride + r].
struct DotLanes {
  D16* squares;
  D16* dots;
  int64_t dot_stride;

  double* square(int r, int first) const { return reinterpret_cast<double*>(squares + r) + first; }
  double* dot(int q, int r, int first) const { return reinterpret_cast<double*>(dots + q * dot_stride + r) + first; }
};

// Lanes [first, first + kDotPartLanes) of `part` over [h0, h1) (h0 % 16 == 0) of K rows (row r at
// row0 + r * row_stride) against Q queries from `queries` (see row_query_dots). kPrefetch: also fetch
// the line at h of each row's next-token copy, `next_offset` elements on, into L2.
template <int K, int Q, bool kSquares, bool kPrefetch>
inline void row_query_dots_part(const float* row0, int64_t row_stride, const PartQueries& queries, int64_t s,
                                int part, int64_t h0, int64_t h1, const DotLanes& lanes, int64_t next_offset) {
  const int first = part * kDotPartLanes;
  DPart sq[K], acc[Q][K], v[K];  // one register each, since every loop over r and q is unrolled
#pragma GCC unroll 8
  for (int r = 0; r < K; ++r) {
    if (kSquares) sq[r] = dpart_load(lanes.square(r, first));
#pragma GCC unroll 8
    for (int q = 0; q < Q; ++q) acc[q][r] = dpart_load(lanes.dot(q, r, first));
  }
  const double* query = queries.at(h0, part, s);
  const int64_t group_stride = queries.group_stride();
  int64_t h = h0;
  for (; h + kLanes <= h1; h += kLanes, query += group_stride) {
#pragma GCC unroll 8
    for (int r = 0; r < K; ++r) {
      const float* row = row0 + r * row_stride + h;
      if (kPrefetch) prefetch_l2(row + next_offset);
      v[r] = dpart_widen(row + first);
    }
    add_dot_part<K, Q, kSquares>(v, query, sq, acc);
  }
  if (h < h1) {  // the last, partial group (h1 == D), copied zero padded; each part widens its lanes
    float group[kLanes];
    for (int r = 0; r < K; ++r) {
      copy_partial(row0 + r * row_stride + h, h1 - h, group);
      v[r] = dpart_widen(group + first);
    }
    add_dot_part<K, Q, kSquares>(v, query, sq, acc);
  }
#pragma GCC unroll 8
  for (int r = 0; r < K; ++r) {
    if (kSquares) dpart_store(lanes.square(r, first), sq[r]);
#pragma GCC unroll 8
    for (int q = 0; q < Q; ++q) dpart_store(lanes.dot(q, r, first), acc[q][r]);
  }
}

// Lanes over [h0, h1) of K rows' dots with queries [s, s + Q) (float64, zero padded, element order),
// and with kSquares of the rows' squares, one part of the lanes after the other. With next_offset > 0
// the first part prefetches the rows' next-token copies into L2.
template <int K, int Q, bool kSquares>
inline void row_query_dots(const float* row0, int64_t row_stride, const PartQueries& queries, int64_t s,
                           int64_t h0, int64_t h1, const DotLanes& lanes, int64_t next_offset) {
  for (int part = 0; part < kDotParts; ++part) {
    if (part == 0 && next_offset > 0) {
      row_query_dots_part<K, Q, kSquares, true>(row0, row_stride, queries, s, part, h0, h1, lanes, next_offset);
    } else {
      row_query_dots_part<K, Q, kSquares, false>(row0, row_stride, queries, s, part, h0, h1, lanes, 0);
    }
  }
}

// Pass 2 of Q queries over [h0, h1): steps of kPrepareSumGroups groups, single groups, the partial one.
template <int Q, bool kStream>
inline void numerator_tile(const float* const* rows, int64_t row_num, const float* const* weights, int64_t h0,
                           int64_t h1, float* const* out) {
  constexpr int64_t kStep = kPrepareSumGroups * kLanes;
  int64_t h = h0;
  for (; h + kStep <= h1; h += kStep) weighted_row_sums<Q, kPrepareSumGroups, kStream>(rows, row_num, weights, h, out);
  for (; h + kLanes <= h1; h += kLanes) weighted_row_sums<Q, 1, kStream>(rows, row_num, weights, h, out);
  if (h < h1) {
    V16 acc[Q];
    weighted_row_sums_partial<Q>(rows, row_num, weights, h, h1 - h, acc);
    for (int q = 0; q < Q; ++q) vstore_partial(out[q] + h, acc[q], h1 - h);
  }
}

// max of a row of logits, NaN if any is NaN (as torch.amax).
inline double row_max(const double* x, int64_t n) {
  double top = -INFINITY;
  for (int64_t i = 0; i < n; ++i) {
    if (std::isnan(x[i])) return x[i];
    if (x[i] > top) top = x[i];
  }
  return top;
}

// Pass 1 walks H in chunks of this many elements (a multiple of 16), every row block against every
// query block over one chunk before the next, so that a chunk of the token's rows (32 KiB at N = 8)
// and of the queries (64 KiB at S = 8) are reused from L1/L2 by the blocks. The lanes go through
// memory between chunks; no element's operations change. Timed on an AMD Zen 4 host (N = S = 8,
// D = 2048, one thread, from cache): chunks of 1024 take 0.9 of the time of chunks of 256, whose
// per-chunk loads and stores of the lanes cost more than the queries' trips to L2 save.
constexpr int64_t kPrepareChunk = 1024;

// A task's scratch and the per-call constants it reads.
struct PrepareTask {
  const PrepareArgs& args;
  int64_t valid;                       // rows read per token
  const PartQueries& queries;
  bool stream;
  LaneArray squares, dots;             // [Nv], [query_tile, Nv]
  std::vector<double> norms, logits;   // [Nv] each
  std::vector<float> weights;          // [query_tile, Nv] exps, as float32
  std::vector<const float*> rows;      // [Nv] of the token, row i at rows[0] + i * hidden

  PrepareTask(const PrepareArgs& a, int64_t nv, const PartQueries& q, bool s)
      : args(a), valid(nv), queries(q), stream(s), squares(nv), dots(a.query_tile * nv), norms(nv), logits(nv),
        weights(a.query_tile * nv), rows(nv) {}

  // Pass 1 of token t's rows against queries [q0, q0 + count): squares (once per group) and dots;
  // with prefetch, the next token's rows are fetched meanwhile.
  void score_lanes(int64_t q0, int64_t count, bool prefetch) {
    for (int64_t i = 0; i < valid; ++i) squares[i] = dzero();
    for (int64_t i = 0; i < count * valid; ++i) dots[i] = dzero();
    const HiddenTiles& tiles = args.tiles;
    for (int64_t tile = 0; tile < tiles.h_tile_num; ++tile) {
      for (int64_t h0 = tiles.begin(tile); h0 < tiles.end(tile); h0 += kPrepareChunk) {
        score_chunk(q0, count, prefetch, h0, std::min(tiles.end(tile), h0 + kPrepareChunk));
      }
    }
  }

  // Pass 1 over one chunk [h0, h1) of the hidden dimension, every row block against every query block.
  void score_chunk(int64_t q0, int64_t count, bool prefetch, int64_t h0, int64_t h1) {
    const int64_t next_offset = prefetch ? args.blocks * args.hidden : 0;  // the next token's rows
    for_row_groups<kPrepareDotRows>(valid, [&](auto k, int64_t r) {
      for_row_groups<kPrepareDotQueries>(count, [&](auto q, int64_t s) {
        constexpr int kK = decltype(k)::value, kQ = decltype(q)::value;
        const DotLanes lanes{squares.data() + r, dots.data() + s * valid + r, valid};
        if (s == 0) {  // the squares, and the next token's rows fetched, once per row
          row_query_dots<kK, kQ, true>(rows[r], args.hidden, queries, q0 + s, h0, h1, lanes, next_offset);
        } else {
          row_query_dots<kK, kQ, false>(rows[r], args.hidden, queries, q0 + s, h0, h1, lanes, 0);
        }
      });
    });
  }

  // From the lanes: norms, then per query its logits' max, exps and their sum (stored), the exps as weights.
  void softmax_state(int64_t t, int64_t q0, int64_t count) {
    for (int64_t i = 0; i < valid; ++i) {
      norms[i] = std::sqrt(lane_sum(squares[i]) / static_cast<double>(args.hidden) + static_cast<double>(args.eps));
    }
    for (int64_t q = 0; q < count; ++q) {
      for (int64_t i = 0; i < valid; ++i) logits[i] = lane_sum(dots[q * valid + i]) / norms[i];
      const double top = row_max(logits.data(), valid);
      double total = 0.0;  // rows in order
      for (int64_t i = 0; i < valid; ++i) {
        const double e = std::exp(logits[i] - top);  // the C library's exp: the same call on every path
        total += e;
        weights[q * valid + i] = static_cast<float>(e);
      }
      const int64_t state = (q0 + q) * args.tokens + t;
      args.logit_max[state] = static_cast<float>(top);
      args.exp_sum[state] = static_cast<float>(total);
    }
  }

  // Pass 2 of token t for queries [q0, q0 + count).
  void numerators(int64_t t, int64_t q0, int64_t count) {
    const HiddenTiles& tiles = args.tiles;
    for (int64_t tile = 0; tile < tiles.h_tile_num; ++tile) {
      const int64_t h0 = tiles.begin(tile), h1 = tiles.end(tile);
      for_row_groups<kPrepareSumQueries>(count, [&](auto q, int64_t s) {
        constexpr int kQ = decltype(q)::value;
        const float* block_weights[kQ];
        float* out[kQ];
        for (int j = 0; j < kQ; ++j) {
          block_weights[j] = weights.data() + (s + j) * valid;
          out[j] = args.numerator + ((q0 + s + j) * args.tokens + t) * args.hidden;
        }
        if (stream) {
          numerator_tile<kQ, true>(rows.data(), valid, block_weights, h0, h1, out);
        } else {
          numerator_tile<kQ, false>(rows.data(), valid, block_weights, h0, h1, out);
        }
      });
    }
  }

  // No valid snapshot: the empty state (numerator 0, logit_max the lowest float32, exp_sum 0).
  void empty_state(int64_t t) {
    for (int64_t s = 0; s < args.queries; ++s) {
      const int64_t state = s * args.tokens + t;
      std::memset(args.numerator + state * args.hidden, 0, static_cast<size_t>(args.hidden) * sizeof(float));
      args.logit_max[state] = kLowestFloat32;
      args.exp_sum[state] = 0.0f;
    }
  }

  void run(int64_t core) {
    int64_t start, stop;
    core_range(core, args.former_core_num, args.former_core_tokens, args.tail_core_tokens, &start, &stop);
    for (int64_t t = start; t < stop; ++t) {
      if (valid == 0) {
        empty_state(t);
        continue;
      }
      for (int64_t i = 0; i < valid; ++i) rows[i] = args.block_res + (t * args.blocks + i) * args.hidden;
      for (int64_t group = 0; group < args.query_tile_num; ++group) {
        const int64_t q0 = group * args.query_tile;
        const int64_t count = group == args.query_tile_num - 1 ? args.query_last_tile : args.query_tile;
        score_lanes(q0, count, group == 0 && t + 1 < stop);
        softmax_state(t, q0, count);
        numerators(t, q0, count);
      }
    }
    if (stream) stream_fence();  // this task's streaming stores are visible when the call returns
  }
};

}  // namespace

void prepare(const PrepareArgs& args, int max_threads) {
  const int64_t valid = static_cast<int64_t>(std::min<uint64_t>(*args.valid_blocks, args.blocks));
  const PartQueries queries(args.pseudo_query, args.queries, args.hidden, args.block_res);
  const bool stream = args.stream_stores && can_stream<float>(args.numerator, args.hidden);
  parallel_tasks(args.used_core_num, max_threads, [&](int64_t core) {
    PrepareTask task(args, valid, queries, stream);
    task.run(core);
  });
}
