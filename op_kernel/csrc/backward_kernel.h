// Native CPU kernel of BlockAttentionResidualsGrad (the backward), executing a BackwardTilingData.
// Included by isa_*.cpp inside an instruction set's namespace, after its target pragma.
//
// With go = grad_hidden_states, p = probs, r = inv_norm, w = norm_weight * proj_weight:
// per core of the tiling (a task of the thread pool), per chunk of CHUNK_TOKENS tokens of its chunk range,
// per block of `tokens_per_loop` tokens:
//   pass 1, token by token, over the hidden tiles: float64 lanes of g = sum_h go * v and
//           wv = sum_h w * v for all N+1 rows  ->  gs = p (g - sum_j p_j g_j),
//           a = gs r, c = gs wv r^3 / H    (float64, stored as float32);
//           16-bit inputs add their terms in short float32 runs first (kernel_loops.h, kRunGroups)
//   pass 2, token by token, over the hidden tiles, rows still in cache:
//           gv_i = go p_i + a_i w - c_i v_i           (the input gradients)
//           chunk_row += a_i v_i, tokens then rows in order   (weight gradients)
//           (bfloat16 on the 512-bit paths: value rows read a line at a time, split; kSplitLines;
//           bfloat16 on avx2: a token's gradients stored without a NaN check when they hold none; kNumberStores)
// The chunk row is the chunk's float32 workspace row [H]. Once every task is
// done the chunk rows are summed in chunk order, so the weight gradients have
// the same bits for any core split; per element the input gradients are a fixed
// sequence of operations, so they do too.

namespace {

// Pass 2 of bfloat16 on the paths with kSplitBf16Lines (simd_*.h) reads each value row a 64-byte line
// at a time, split into its even and odd elements by one shift and one mask, where two vloads take two
// broadcast loads and two byte shuffles (as the forward's pass 2; docs/notes/kernel-variants.md).
// Its float rows (go, w, the chunk row) then hold each line of 32 elements as the line's 16 even
// elements and then its 16 odd ones (the split line layout), and the last H % 32 elements in the lane
// layout of T. Every element sees the same operations either way: the same bits. A line must not
// straddle two tiles, so a call uses the layout only when every tile starts on a line.
template <typename T>
constexpr bool kSplitLines = std::is_same<T, BF16>::value && kSplitBf16Lines;

// Where a row's whole lines end in the split line layout.
inline int64_t split_lines_end(int64_t hidden) { return hidden / (2 * kLanes) * (2 * kLanes); }

// A row of T as float32 in the split line layout, zero padded: [H_pad]
template <typename T>
inline void to_split_line_layout(const T* row, int64_t hidden, float* out) {
  const int64_t lines_end = split_lines_end(hidden);
  for (int64_t h = 0; h < lines_end; h += 2 * kLanes) {
    V16 even, odd;
    vload_split(row + h, even, odd);
    vstore(out + h, even);
    vstore(out + h + kLanes, odd);
  }
  to_lane_layout(row + lines_end, hidden - lines_end, out + lines_end);
}

// score_weight in the split line layout: the same products, elsewhere in the row.
template <typename T>
inline void split_line_score_weight(const T* norm_weight, const T* proj_weight, int64_t hidden, float* w) {
  const int64_t lines_end = split_lines_end(hidden);
  for (int64_t h = 0; h < lines_end; h += 2 * kLanes) {
    V16 norm_even, norm_odd, proj_even, proj_odd;
    vload_split(norm_weight + h, norm_even, norm_odd);
    vload_split(proj_weight + h, proj_even, proj_odd);
    vstore(w + h, vmul(norm_even, proj_even));
    vstore(w + h + kLanes, vmul(norm_odd, proj_odd));
  }
  score_weight(norm_weight + lines_end, proj_weight + lines_end, hidden - lines_end, w + lines_end);
}

// A row of T as float32 in pass 2's layout: split lines or the lane layout of T, zero padded: [H_pad]
template <typename T>
inline void to_pass2_layout(bool split_lines, const T* row, int64_t hidden, float* out) {
  if constexpr (kSplitLines<T>) {
    if (split_lines) return to_split_line_layout(row, hidden, out);
  }
  to_lane_layout(row, hidden, out);
}

// A float row [H] in natural order from one in the split line layout of T ([H_pad]).
template <typename T>
inline void from_split_line_layout(const float* lines, int64_t hidden, float* out) {
  const int64_t lines_end = split_lines_end(hidden);
  for (int64_t h = 0; h < lines_end; h += 2 * kLanes) {
    for (int64_t l = 0; l < kLanes; ++l) {
      out[h + 2 * l] = lines[h + l];
      out[h + 2 * l + 1] = lines[h + kLanes + l];
    }
  }
  from_lane_layout<T>(lines + lines_end, hidden - lines_end, out + lines_end);
}

// A float row [H] in natural order from one in pass 2's layout (to_pass2_layout's inverse).
template <typename T>
inline void from_pass2_layout(bool split_lines, const float* row, int64_t hidden, float* out) {
  if (split_lines) return from_split_line_layout<T>(row, hidden, out);
  from_lane_layout<T>(row, hidden, out);
}

// One line of a value row as the groups pass 2 computes on (kSplit: split, else in the lane layout
// of T), and a line of gradients back into memory order (kNumbers: groups that hold no NaN).
template <bool kSplit, int kGroups, typename T>
inline void load_value_line(const T* p, V16* groups) {
  if constexpr (kSplit) {
    vload_split(p, groups[0], groups[1]);
  } else {
    for (int g = 0; g < kGroups; ++g) groups[g] = vload(p + g * kLanes);
  }
}
template <bool kStream, bool kSplit, bool kNumbers, typename T>
inline void store_gradient_line(T* p, const V16* groups) {
  if constexpr (kNumbers) {
    store_groups<2, kStream, true>(p, groups);  // a line of bfloat16: two groups
  } else if constexpr (!kSplit) {
    store_line<kStream>(p, groups);
  } else if (kStream) {
    vstream_split(p, groups[0], groups[1]);
  } else {
    vstore_split(p, groups[0], groups[1]);
  }
}

// Per-token row coefficients, [N+1] each.
struct RowCoefficients {
  float* p;  // probs
  float* a;  // gs * r
  float* c;  // gs * wv * r^3 / H
};

// Whether pass 2 may store a token's gradients without looking for NaNs (kNumberStores): they can hold
// none when go, w and every v_i are finite, and p_i, a_i, c_i are. Then gv_i = fma(-c_i, v_i, fma(a_i, w,
// go p_i)) is a number or an infinity: only go p_i can overflow, and an fma of finite factors with an
// infinite addend is that infinity. Pass 1 has seen go and v_i finite when every row's sums g and wv are
// (a non-finite factor makes its product, and so the sum, inf or NaN); w (float32, w_finite) is checked
// once per call.
inline bool gradients_are_numbers(bool w_finite, const double* g, const double* wv, const RowCoefficients& k,
                                  int64_t row_num) {
  return w_finite && all_finite(g, row_num) && all_finite(wv, row_num) && all_finite(k.p, row_num) &&
         all_finite(k.a, row_num) && all_finite(k.c, row_num);
}

// K rows i = r0 .. r0+K-1 of one token over hidden [h0, h1):
//   gv_i[h] = go[h] p_i + a_i w[h] - c_i v_i[h]     (written to the gradient rows)
//   chunk_row[h] += a_i v_i[h]                       (rows in order)
// go, w and chunk_row are float buffers in the lane layout of T, or with kSplit in the split line
// layout (h0 then on a line), zero padded; they are read where they are used, not held in registers
// across the K rows (AVX2's 16 registers spilled them: 6-10% of the 16-bit backward from memory).
// kNumbers: the gradients hold no NaN (kNumberStores).
// The caller walks rows in order, so every chunk_row element adds tokens then rows
// in order whatever the tiling or K. A few rows at a time keep the chunk row's
// loads and stores few, and the write streams few (streaming stores lose their
// benefit when one thread interleaves many write streams).
// Forced inline: with the split lines' instances GCC made the single-row ones calls, and the bfloat16
// backward ran 1.17 times as slow from memory (Zen 4, avx512bf16).
template <int K, bool kStream, bool kSplit, bool kNumbers, typename T>
[[gnu::always_inline]] inline void grad_rows(const T* const* v, T* const* gv, const T* next_go,
                                             const RowCoefficients& k, int64_t r0, const float* go, const float* w,
                                             float* chunk_row, int64_t h0, int64_t h1) {
  // Groups per step: a whole 64-byte line of each gradient row before moving to the
  // next row, so that streaming stores always fill complete lines.
  constexpr int kGroups = sizeof(T) == 2 ? 2 : 1;
  V16 p_v[K], a_v[K], neg_c[K];
  for (int j = 0; j < K; ++j) {
    p_v[j] = vset(k.p[r0 + j]);
    a_v[j] = vset(k.a[r0 + j]);
    neg_c[j] = vset(-k.c[r0 + j]);
  }
  int64_t h = h0;
  for (; h + kGroups * kLanes <= h1; h += kGroups * kLanes) {
    V16 acc[kGroups];
    for (int g = 0; g < kGroups; ++g) acc[g] = vload(chunk_row + h + g * kLanes);
    // One 64-byte line of each row per step (fp32: 1 group, 16-bit: 2).
    if (r0 == 0 && next_go != nullptr) prefetch(next_go + h);
    for (int j = 0; j < K; ++j) {
      V16 value[kGroups], grad[kGroups];
      load_value_line<kSplit, kGroups>(v[r0 + j] + h, value);
      for (int g = 0; g < kGroups; ++g) {
        const int64_t e = h + g * kLanes;
        grad[g] = vfma(neg_c[j], value[g], vfma(a_v[j], vload(w + e), vmul(vload(go + e), p_v[j])));
        acc[g] = vfma(a_v[j], value[g], acc[g]);
      }
      store_gradient_line<kStream, kSplit, kNumbers>(gv[r0 + j] + h, grad);
    }
    for (int g = 0; g < kGroups; ++g) vstore(chunk_row + h + g * kLanes, acc[g]);
  }
  for (; h < h1; h += kLanes) {  // a single group left over, possibly the last, partial one (h1 == H)
    const int64_t n = std::min(kLanes, h1 - h);
    const V16 go_v = vload(go + h), w_v = vload(w + h);
    V16 acc = vload(chunk_row + h);
    for (int j = 0; j < K; ++j) {
      const V16 value = n == kLanes ? vload(v[r0 + j] + h) : vload_partial(v[r0 + j] + h, n);
      const V16 grad = vfma(neg_c[j], value, vfma(a_v[j], w_v, vmul(go_v, p_v[j])));
      if (n == kLanes) {
        vstore(gv[r0 + j] + h, grad);
      } else {
        vstore_partial(gv[r0 + j] + h, grad, n);
      }
      acc = vfma(a_v[j], value, acc);
    }
    vstore(chunk_row + h, acc);
  }
}

// next_go (or null): grad_hidden_states of the token this core takes up a block later; its
// lines are prefetched (its value rows are, in pass 1).
template <bool kStream, bool kSplit, bool kNumbers, typename T>
inline void grad_tile(const T* const* rows, T* const* grads, const T* next_go,
                      int64_t row_num, const RowCoefficients& k, const float* go, const float* w, float* chunk_row,
                      int64_t h0, int64_t h1) {
  constexpr int kRows = 2;  // rows per grad_rows call (docs/notes/kernel-variants.md)
  int64_t i = 0;
  for (; i + kRows <= row_num; i += kRows) {
    grad_rows<kRows, kStream, kSplit, kNumbers>(rows, grads, next_go, k, i, go, w, chunk_row, h0, h1);
  }
  for (; i < row_num; ++i) {
    grad_rows<1, kStream, kSplit, kNumbers>(rows, grads, next_go, k, i, go, w, chunk_row, h0, h1);
  }
}

// Pass 2 of one token over every hidden tile; split_lines: its float rows in the split line layout;
// numbers: its gradients hold no NaN (gradients_are_numbers).
template <bool kStream, typename T>
inline void grad_tiles(bool split_lines, bool numbers, const HiddenTiles& tiles, const T* const* rows,
                       T* const* grads, const T* next_go, int64_t row_num, const RowCoefficients& k, const float* go,
                       const float* w, float* chunk_row) {
  for (int64_t tile = 0; tile < tiles.h_tile_num; ++tile) {
    const int64_t h0 = tiles.begin(tile), h1 = tiles.end(tile);
    if constexpr (kSplitLines<T>) {
      if (split_lines) {
        grad_tile<kStream, true, false>(rows, grads, next_go, row_num, k, go, w, chunk_row, h0, h1);
        continue;
      }
    }
    if constexpr (kNumberStores<T>) {
      if (numbers) {
        grad_tile<kStream, false, true>(rows, grads, next_go, row_num, k, go, w, chunk_row, h0, h1);
        continue;
      }
    }
    grad_tile<kStream, false, false>(rows, grads, next_go, row_num, k, go, w, chunk_row, h0, h1);
  }
}

// a and c of one token's rows from its sums g = sum go v and wv = sum w v (scalar code, the same
// for every token), in float64 until stored: gs subtracts sum_j p_j g_j from g, which cancels.
inline void row_coefficients(const double* g, const double* wv, const float* inv_norm, int64_t row_num,
                             int64_t hidden, const RowCoefficients& k) {
  double pg = 0.0;  // sum_j p_j g_j, rows in order
  for (int64_t i = 0; i < row_num; ++i) pg += static_cast<double>(k.p[i]) * g[i];
  for (int64_t i = 0; i < row_num; ++i) {
    const double r = inv_norm[i];
    const double gs = k.p[i] * (g[i] - pg);
    k.a[i] = static_cast<float>(gs * r);
    k.c[i] = static_cast<float>(gs * wv[i] * r * r * r / static_cast<double>(hidden));
  }
}

// The rows whose run sums may have lost bits (kRunMinSum; the runs sum exactly a zero row's sums,
// and every row's g when go is zero): summed again in float64 lanes, their sums replaced. go_wide:
// [H_pad] scratch, filled with go in float64 the first time a row needs it.
template <typename T>
inline void resum_rows_that_lost_bits(const T* const* rows, int64_t row_num, const T* go, const double* w,
                                      int64_t hidden, double* go_wide, double* g, double* wv) {
  int go_is_zero = -1;  // not known yet
  const auto go_zero = [&] {
    if (go_is_zero < 0) go_is_zero = is_zero_row(go, hidden) ? 1 : 0;
    return go_is_zero == 1;
  };
  bool widened = false;
  for (int64_t i = 0; i < row_num; ++i) {
    const bool g_small = std::fabs(g[i]) < kRunMinSum, wv_small = std::fabs(wv[i]) < kRunMinSum;
    const bool lost = !std::isfinite(g[i]) || !std::isfinite(wv[i]) ||
                      ((g_small || wv_small) && !is_zero_row(rows[i], hidden) && (wv_small || !go_zero()));
    if (!lost) continue;
    if (!widened) to_wide_lane_layout(go, hidden, go_wide);
    widened = true;
    sum_row_in_float64<false>(rows[i], go_wide, w, hidden, &g[i], &wv[i]);
  }
}

template <typename T>
void backward_impl(const BackwardArgs& args, int max_threads) {
  const T* partial_block = static_cast<const T*>(args.partial_block);  // [T, H]
  const T* block_res = static_cast<const T*>(args.block_res);          // [T, N, H]
  const T* grad_hidden = static_cast<const T*>(args.grad_hidden_states);  // [T, H]
  T* grad_partial = static_cast<T*>(args.grad_partial_block);          // [T, H]
  T* grad_blocks = static_cast<T*>(args.grad_block_res);               // [T, N, H]
  const int64_t blocks = args.blocks, rows = args.blocks + 1, hidden = args.hidden;
  const int64_t block_tokens = args.tokens_per_loop;
  const HiddenTiles tiles = args.tiles;
  const T* proj_weight = static_cast<const T*>(args.proj_weight);
  const T* norm_weight = static_cast<const T*>(args.norm_weight);

  const int64_t hidden_pad = padded_hidden(hidden);
  // The float rows pass 2 loads, at distinct distances from the gradient rows it stores (PhasedRow).
  const void* grad_rows_start = blocks > 0 ? static_cast<const void*>(grad_blocks) : grad_partial;
  PhasedRow w(hidden_pad, grad_rows_start, 1024);  // [H_pad] score weight, lane layout of T
  score_weight(norm_weight, proj_weight, hidden, w.data());
  // Pass 2's float rows in the split line layout (kSplitLines) when every tile starts on a line; its
  // score weight is then a row of its own.
  const bool split_lines = kSplitLines<T> && (tiles.h_tile_num == 1 || tiles.h_tile % (2 * kLanes) == 0);
  PhasedRow split_w(split_lines ? hidden_pad : 0, grad_rows_start, 3584);  // [H_pad]
  if constexpr (kSplitLines<T>) {
    if (split_lines) split_line_score_weight(norm_weight, proj_weight, hidden, split_w.data());
  }
  const float* pass2_w = split_lines ? split_w.data() : w.data();
  const bool w_finite = kNumberStores<T> && all_finite(w.data(), hidden_pad);
  PhasedRow<double> w_wide(hidden_pad, grad_rows_start, 1536);  // [H_pad] the same, exact in float64: pass 1's sums
  wide_score_weight(norm_weight, proj_weight, hidden, w_wide.data());
  // 16-bit inputs: pass 1 in float32 runs when it is exact (kernel_loops.h, kRunGroups).
  const bool in_runs = sizeof(T) == 2 && score_weight_is_float32(w.data(), w_wide.data(), hidden_pad);
  const bool stream = args.stream_stores && can_stream<T>(grad_partial, hidden) &&
                      (blocks == 0 || can_stream<T>(grad_blocks, hidden));

  // One task per core of the tiling; scratch is the task's own.
  const auto core_task = [&](int64_t core) {
    std::vector<const T*> row_ptrs(block_tokens * rows);  // [B, N+1] value rows of the block's tokens
    std::vector<T*> grad_ptrs(block_tokens * rows);       // [B, N+1] their gradient rows
    std::vector<float> coefficients(3 * block_tokens * rows);  // p, a, c: [3, B, N+1]
    std::vector<char> numbers(block_tokens);                    // [B] gradients_are_numbers
    std::vector<double> g(rows), wv(rows);                      // [N+1] the token's sums, reduced
    PhasedRow go(hidden_pad, grad_rows_start, 2048);  // [H_pad] grad_hidden_states[t] as float32, pass 2's layout
    PhasedRow<double> go_wide(hidden_pad, grad_rows_start, 2560);  // [H_pad] grad_hidden_states[t] in float64, ditto
    VectorArray<RunSums> runs(rows);          // [N+1] float32 runs in progress (16-bit inputs)
    PhasedRow chunk_sum(hidden_pad, grad_rows_start, 3072);  // [H_pad] the chunk's weight-gradient row, ditto
    LaneArray g_lanes(rows), wv_lanes(rows);                    // [N+1] lanes of the token in pass 1
    std::vector<const T*> next_rows(rows);                       // [N+1] rows to prefetch
    int64_t first, last;
    core_range(core, args.former_core_num, args.former_core_chunks, args.tail_core_chunks, &first, &last);
    const int64_t core_stop = std::min(last * args.chunk_tokens, args.tokens);  // this core's last token + 1
    // The value rows of token t + block_tokens (the same place in this core's next block), or null.
    const auto rows_to_prefetch = [&](int64_t t) -> const T* const* {
      if (t + block_tokens >= core_stop) return nullptr;
      for (int64_t i = 0; i < rows; ++i) {
        next_rows[i] = value_row(block_res, partial_block, t + block_tokens, i, blocks, hidden);
      }
      return next_rows.data();
    };
    for (int64_t chunk = first; chunk < last; ++chunk) {
      std::fill(chunk_sum.data(), chunk_sum.data() + hidden_pad, 0.0f);
      const int64_t chunk_stop = std::min((chunk + 1) * args.chunk_tokens, args.tokens);
      for (int64_t t0 = chunk * args.chunk_tokens; t0 < chunk_stop; t0 += block_tokens) {
        const int64_t t1 = std::min(t0 + block_tokens, chunk_stop);
        // Pass 1: lanes carried across the hidden tiles, reduced once per row.
        for (int64_t t = t0; t < t1; ++t) {
          const int64_t b = t - t0;
          const T** token_rows = row_ptrs.data() + b * rows;
          T** token_grads = grad_ptrs.data() + b * rows;
          for (int64_t i = 0; i < rows; ++i) {
            token_rows[i] = value_row(block_res, partial_block, t, i, blocks, hidden);
            token_grads[i] = i < blocks ? grad_blocks + (t * blocks + i) * hidden : grad_partial + t * hidden;
          }
          for (int64_t i = 0; i < rows; ++i) {
            g_lanes[i] = wv_lanes[i] = dzero();
            runs[i] = {vzero(), vzero()};
          }
          const T* go_row = grad_hidden + t * hidden;
          if (!in_runs) to_wide_lane_layout(go_row, hidden, go_wide.data());
          const T* const* next = rows_to_prefetch(t);
          // The rows' first lines, and grad_hidden_states' (grad_tile prefetches its other lines).
          if (const int64_t ahead = t + kRowStartBlocksAhead * block_tokens; ahead < core_stop) {
            prefetch_row_starts(block_res, partial_block, ahead, rows, blocks, hidden);
            prefetch_l2(grad_hidden + ahead * hidden);
          }
          for (int64_t tile = 0; tile < tiles.h_tile_num; ++tile) {
            if (in_runs) {
              if constexpr (sizeof(T) == 2) {  // in_runs is never true for float32
                add_runs_rows<false>(token_rows, rows, go_row, w.data(), tiles.begin(tile), tiles.end(tile), hidden,
                                     runs.data(), g_lanes.data(), wv_lanes.data(), next);
              }
            } else {
              dot_lanes_rows<false>(token_rows, rows, go_wide.data(), w_wide.data(), tiles.begin(tile),
                                    tiles.end(tile), g_lanes.data(), wv_lanes.data(), next);
            }
          }
          for (int64_t i = 0; i < rows; ++i) {
            g[i] = lane_sum(g_lanes[i]);
            wv[i] = lane_sum(wv_lanes[i]);
          }
          if (in_runs) {
            resum_rows_that_lost_bits(token_rows, rows, go_row, w_wide.data(), hidden, go_wide.data(), g.data(),
                                      wv.data());
          }
          const RowCoefficients k{coefficients.data() + b * rows,
                                  coefficients.data() + (block_tokens + b) * rows,
                                  coefficients.data() + (2 * block_tokens + b) * rows};
          std::memcpy(k.p, args.probs + t * rows, rows * sizeof(float));
          row_coefficients(g.data(), wv.data(), args.inv_norm + t * rows, rows, hidden, k);
          numbers[b] = kNumberStores<T> && gradients_are_numbers(w_finite, g.data(), wv.data(), k, rows);
        }
        // Pass 2: input gradients and the chunk row, token by token (the chunk row's order).
        for (int64_t t = t0; t < t1; ++t) {
          const int64_t b = t - t0;
          const RowCoefficients k{coefficients.data() + b * rows,
                                  coefficients.data() + (block_tokens + b) * rows,
                                  coefficients.data() + (2 * block_tokens + b) * rows};
          const T* const* token_rows = row_ptrs.data() + b * rows;
          T* const* token_grads = grad_ptrs.data() + b * rows;
          to_pass2_layout(split_lines, grad_hidden + t * hidden, hidden, go.data());
          const T* next_go = t + block_tokens < core_stop ? grad_hidden + (t + block_tokens) * hidden : nullptr;
          if (stream) {
            grad_tiles<true>(split_lines, numbers[b], tiles, token_rows, token_grads, next_go, rows, k, go.data(),
                             pass2_w, chunk_sum.data());
          } else {
            grad_tiles<false>(split_lines, numbers[b], tiles, token_rows, token_grads, next_go, rows, k, go.data(),
                              pass2_w, chunk_sum.data());
          }
        }
      }
      // The chunk's row, in natural order, into its workspace row [H].
      from_pass2_layout<T>(split_lines, chunk_sum.data(), hidden, args.chunk_rows + chunk * hidden);
    }
    if (stream) stream_fence();  // this task's streaming stores are visible when the tasks are done
  };
  parallel_tasks(args.used_core_num, max_threads, core_task);

  // Weight gradients: chunk rows summed in chunk order (float64), per hidden column.
  T* grad_proj = static_cast<T*>(args.grad_proj_weight);  // [H]
  T* grad_norm = static_cast<T*>(args.grad_norm_weight);  // [H]
  constexpr int64_t kColumns = 256;
  const int64_t column_blocks = (hidden + kColumns - 1) / kColumns;
  const auto column_task = [&](int64_t cb) {
    const int64_t h0 = cb * kColumns, width = std::min(kColumns, hidden - h0);
    double sums[kColumns] = {};
    for (int64_t chunk = 0; chunk < args.chunk_num; ++chunk) {
      const float* chunk_row = args.chunk_rows + chunk * hidden + h0;
      for (int64_t j = 0; j < width; ++j) sums[j] += chunk_row[j];
    }
    for (int64_t j = 0; j < width; ++j) {
      grad_norm[h0 + j] = from_float<T>(static_cast<float>(sums[j] * to_float(proj_weight[h0 + j])));
      grad_proj[h0 + j] = from_float<T>(static_cast<float>(sums[j] * to_float(norm_weight[h0 + j])));
    }
  };
  parallel_tasks(column_blocks, args.chunk_num > 1 ? max_threads : 1, column_task);  // one chunk: little to sum
}

}  // namespace

void backward(const BackwardArgs& args, int max_threads) {
  switch (args.dtype) {
    case DType::kFloat32:
      backward_impl<float>(args, max_threads);
      break;
    case DType::kFloat16:
      backward_impl<FP16>(args, max_threads);
      break;
    case DType::kBFloat16:
      backward_impl<BF16>(args, max_threads);
      break;
  }
}
