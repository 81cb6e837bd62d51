// Native CPU kernel of BlockAttentionResiduals (the forward), executing a ForwardTilingData.
// Included by isa_*.cpp inside an instruction set's namespace, after its target pragma.
//
// Per core of the tiling (a task of the thread pool), per block of `tokens_per_loop`
// tokens of its range:
//   pass 1, token by token, over the hidden tiles: for all N+1 rows at once the
//           float64 lanes of sum_h v^2 and sum_h v * w  ->  inv_norm, scores, softmax (float64);
//           16-bit inputs add their terms in short float32 runs first (see kRunGroups)
//   pass 2, token by token, over the hidden tiles: hidden_states = sum_i p_i v_i
//           (bfloat16 on avx2: stored without a NaN check when the token's inputs are finite; kNumberStores)
// The tiling sizes the block so that its rows fit in the core's buffer (on the
// host: its L2), so pass 2 reads them from cache: the inputs cross the memory
// bus once. No [T, N+1, H] temporary exists; per thread there are only
// [tokens_per_loop, N+1] scalars and N+1 lane pairs.

namespace {

// hidden_states[h .. h + 16G) = sum_i p_i * v_i[h .. h + 16G), rows in order: G full groups. next (or
// null): rows whose lines over the same elements are prefetched into L2 (a null row is not). kNumbers:
// the sums hold no NaN (outputs_are_numbers).
template <int G, bool kStream, bool kNumbers, typename T>
inline void weighted_sum_groups(const T* const* rows, const float* p, int64_t row_num, int64_t h, T* out,
                                const T* const* next) {
  constexpr int64_t kLineElements = 64 / static_cast<int64_t>(sizeof(T));
  V16 acc[G];  // in registers: every loop over g is unrolled (else GCC keeps acc on the stack)
#pragma GCC unroll 8
  for (int g = 0; g < G; ++g) acc[g] = vzero();
  // Each element's sum is its own, so bfloat16 lines may come split (kSplitBf16Lines): the same bits.
  constexpr bool kSplit = std::is_same<T, BF16>::value && kSplitBf16Lines && G % 2 == 0;
  for (int64_t i = 0; i < row_num; ++i) {
    if (next != nullptr && next[i] != nullptr) {
      for (int64_t e = 0; e < G * kLanes; e += kLineElements) prefetch_l2(next[i] + h + e);
    }
    const V16 pi = vset(p[i]);
    if constexpr (kSplit) {
#pragma GCC unroll 4
      for (int g = 0; g < G; g += 2) {
        V16 even, odd;
        vload_split(rows[i] + h + g * kLanes, even, odd);
        acc[g] = vfma(pi, even, acc[g]);
        acc[g + 1] = vfma(pi, odd, acc[g + 1]);
      }
    } else {
#pragma GCC unroll 8
      for (int g = 0; g < G; ++g) acc[g] = vfma(pi, vload(rows[i] + h + g * kLanes), acc[g]);
    }
  }
  if constexpr (kSplit) {
#pragma GCC unroll 4
    for (int g = 0; g < G; g += 2) {
      if (kStream) {
        vstream_split(out + h + g * kLanes, acc[g], acc[g + 1]);
      } else {
        vstore_split(out + h + g * kLanes, acc[g], acc[g + 1]);
      }
    }
  } else {
    store_groups<G, kStream, kNumbers>(out + h, acc);
  }
}

// The same for the last, partial group of n < 16 elements.
template <typename T>
inline void weighted_sum_partial(const T* const* rows, const float* p, int64_t row_num, int64_t h, int64_t n, T* out) {
  V16 acc = vzero();
  for (int64_t i = 0; i < row_num; ++i) acc = vfma(vset(p[i]), vload_partial(rows[i] + h, n), acc);
  vstore_partial(out + h, acc, n);
}

// Over [h0, h1): steps of four groups (their accumulators hide the FMA latency), then single groups
// and the partial one; kBackwards: those last ones first, then the steps from h1 down.
// next (or null): rows to prefetch over the same elements, as weighted_sum_groups.
template <bool kStream, bool kBackwards, bool kNumbers, typename T>
inline void weighted_sum_tile(const T* const* rows, const float* p, int64_t row_num, int64_t h0, int64_t h1,
                              T* out, const T* const* next) {
  const int64_t steps_end = h0 + (h1 - h0) / (4 * kLanes) * (4 * kLanes);
  if (!kBackwards) {
    for (int64_t h = h0; h < steps_end; h += 4 * kLanes) {
      weighted_sum_groups<4, kStream, kNumbers>(rows, p, row_num, h, out, next);
    }
  }
  int64_t h = steps_end;
  for (; h + kLanes <= h1; h += kLanes) weighted_sum_groups<1, kStream, kNumbers>(rows, p, row_num, h, out, next);
  if (h < h1) weighted_sum_partial(rows, p, row_num, h, h1 - h, out);
  if (kBackwards) {
    for (h = steps_end - 4 * kLanes; h >= h0; h -= 4 * kLanes) {
      weighted_sum_groups<4, kStream, kNumbers>(rows, p, row_num, h, out, next);
    }
  }
}

// Pass 2 of one token over every hidden tile (interleaved rows: from the last); numbers: its sums hold no
// NaN (outputs_are_numbers).
template <bool kStream, typename T>
inline void weighted_sum_tiles(bool numbers, const HiddenTiles& tiles, const T* const* rows, const float* p,
                               int64_t row_num, T* out, const T* const* next) {
  constexpr bool kBackwards = kInterleavedRows<T>;
  for (int64_t step = 0; step < tiles.h_tile_num; ++step) {
    const int64_t tile = kBackwards ? tiles.h_tile_num - 1 - step : step;
    const int64_t h0 = tiles.begin(tile), h1 = tiles.end(tile);
    if constexpr (kNumberStores<T>) {
      if (numbers) {
        weighted_sum_tile<kStream, kBackwards, true>(rows, p, row_num, h0, h1, out, next);
        continue;
      }
    }
    weighted_sum_tile<kStream, kBackwards, false>(rows, p, row_num, h0, h1, out, next);
  }
}

// Whether pass 2 may store a token's sums without looking for NaNs (kNumberStores): with every v_i and p_i
// finite, sum_i p_i v_i (fused multiply-adds from zero) is a number or an infinity, since a finite product
// added to an infinity leaves it. Pass 1 has seen v_i finite when its sum of squares is.
inline bool outputs_are_numbers(const double* square_sums, const float* probs, int64_t row_num) {
  return all_finite(square_sums, row_num) && all_finite(probs, row_num);
}

// How many of the next token's rows pass 1 prefetches; pass 2 prefetches the rest. The 16-bit
// forward leaves a third to pass 2, whose arithmetic is then overlapped by memory reads too (pass 2
// is about a third of its work); float32's pass 1 is the far longer one and prefetches them all
// (docs/notes/kernel-variants.md).
template <typename T>
constexpr int64_t rows_prefetched_in_pass1(int64_t rows) {
  return sizeof(T) == 2 ? rows - rows / 3 : rows;
}

// Row i's place in the order the passes prefetch rows in (pass 1 the first rows_prefetched_in_pass1):
// for the 16-bit types every third row comes last, so that where pass 1 reads rows in groups of three
// (kRunRows), each group's walk over H prefetches two of them, not the first two groups three each and
// the last none.
template <typename T>
constexpr int64_t prefetch_rank(int64_t i, int64_t rows) {
  if (sizeof(T) == 4) return i;
  return i % 3 != 2 ? i - i / 3 : rows_prefetched_in_pass1<T>(rows) + i / 3;
}

// The rows whose run sums may have lost bits (kRunMinSum, for the sum of squares; a zero row's are
// exact): summed again in float64 lanes, their reduced sums replaced.
template <typename T>
inline void resum_rows_that_lost_bits(const T* const* rows, int64_t row_num, const double* w, int64_t hidden,
                                      double* square_sums, double* score_sums) {
  for (int64_t i = 0; i < row_num; ++i) {
    const bool lost = !std::isfinite(square_sums[i]) || !std::isfinite(score_sums[i]) ||
                      (square_sums[i] < kRunMinSum && !is_zero_row(rows[i], hidden));
    if (lost) {
      sum_row_in_float64<true>(rows[i], static_cast<const double*>(nullptr), w, hidden, &square_sums[i],
                               &score_sums[i]);
    }
  }
}

// inv_norm and probs of one token's rows from their reduced sums (scalar code, the same for every
// token). All in float64 until stored: a score is about sqrt(H) at unit-scale weights, so its
// float32 rounding alone would move a peaked softmax by more than the contract's tolerance.
// scores: [N+1] scratch.
inline void norms_and_softmax(const double* square_sums, const double* score_sums, int64_t row_num, int64_t hidden,
                              float norm_eps, float* inv_norm, float* probs, double* scores) {
  double max_score = -INFINITY;
  for (int64_t i = 0; i < row_num; ++i) {
    const double mean_square = square_sums[i] / static_cast<double>(hidden);
    const double r = 1.0 / std::sqrt(mean_square + static_cast<double>(norm_eps));
    inv_norm[i] = static_cast<float>(r);
    scores[i] = r * score_sums[i];
    if (scores[i] > max_score) max_score = scores[i];
  }
  double total = 0.0;  // rows in order
  for (int64_t i = 0; i < row_num; ++i) {
    scores[i] = std::exp(scores[i] - max_score);  // the C library's exp: the same call on every path
    total += scores[i];
  }
  for (int64_t i = 0; i < row_num; ++i) probs[i] = static_cast<float>(scores[i] / total);
}

template <typename T>
void forward_impl(const ForwardArgs& args, int max_threads) {
  const T* partial_block = static_cast<const T*>(args.partial_block);  // [T, H]
  const T* block_res = static_cast<const T*>(args.block_res);          // [T, N, H]
  T* hidden_states = static_cast<T*>(args.hidden_states);              // [T, H]
  const int64_t blocks = args.blocks, rows = args.blocks + 1, hidden = args.hidden;
  const int64_t block_tokens = args.tokens_per_loop;
  const HiddenTiles tiles = args.tiles;

  const int64_t hidden_pad = padded_hidden(hidden);
  // The weight rows pass 1 loads every group, 64-byte aligned (PhasedRow; pass 2 reads neither).
  PhasedRow<double> w(hidden_pad, hidden_states, 1024);  // [H_pad] score weight, float64, lane layout of T
  wide_score_weight(static_cast<const T*>(args.norm_weight), static_cast<const T*>(args.proj_weight), hidden,
                    w.data());
  const bool stream = args.stream_stores && can_stream<T>(hidden_states, hidden);
  // 16-bit inputs: pass 1 in float32 runs when it is exact (kernel_loops.h, kRunGroups), with the score
  // weight in float32 ([H_pad]; float32 inputs never need it).
  PhasedRow<float> narrow_w(sizeof(T) == 2 ? hidden_pad : 0, hidden_states, 2048);
  if (sizeof(T) == 2) {
    score_weight(static_cast<const T*>(args.norm_weight), static_cast<const T*>(args.proj_weight), hidden,
                 narrow_w.data());
  }
  const bool in_runs = sizeof(T) == 2 && score_weight_is_float32(narrow_w.data(), w.data(), hidden_pad);

  // One task per core of the tiling; scratch is the task's own.
  const auto core_task = [&](int64_t core) {
    std::vector<const T*> row_ptrs(block_tokens * rows);  // [B, N+1] rows of the block's tokens
    std::vector<float> inv_norm(block_tokens * rows);     // [B, N+1]
    std::vector<float> probs(block_tokens * rows);        // [B, N+1]
    std::vector<char> numbers(block_tokens);              // [B] outputs_are_numbers
    LaneArray square_lanes(rows), score_lanes(rows);      // [N+1] lanes of the token in pass 1
    VectorArray<RunSums> runs(rows);                      // [N+1] float32 runs in progress (16-bit inputs)
    std::vector<double> square_sums(rows), score_sums(rows);  // [N+1] its lanes, reduced once
    std::vector<double> scores(rows);                     // [N+1] scratch of norms_and_softmax
    std::vector<const T*> next_rows(rows);                // [N+1] rows to prefetch (null: not in this pass)
    int64_t start, stop;
    core_range(core, args.former_core_num, args.former_core_tokens, args.tail_core_tokens, &start, &stop);
    const int64_t pass1_rows = rows_prefetched_in_pass1<T>(rows);
    // The rows of token t + block_tokens (the same place in this core's next block) whose
    // prefetch_rank is in [first, last), the others null; or null.
    const auto rows_to_prefetch = [&](int64_t t, int64_t first, int64_t last) -> const T* const* {
      if (t + block_tokens >= stop || first == last) return nullptr;
      for (int64_t i = 0; i < rows; ++i) {
        const int64_t rank = prefetch_rank<T>(i, rows);
        next_rows[i] = rank >= first && rank < last
                           ? value_row(block_res, partial_block, t + block_tokens, i, blocks, hidden)
                           : nullptr;
      }
      return next_rows.data();
    };
    for (int64_t t0 = start; t0 < stop; t0 += block_tokens) {
      const int64_t t1 = std::min(t0 + block_tokens, stop);
      // Pass 1: lanes carried across the hidden tiles, reduced once per row.
      for (int64_t t = t0; t < t1; ++t) {
        const T** token_rows = row_ptrs.data() + (t - t0) * rows;
        for (int64_t i = 0; i < rows; ++i) token_rows[i] = value_row(block_res, partial_block, t, i, blocks, hidden);
        for (int64_t i = 0; i < rows; ++i) {
          square_lanes[i] = score_lanes[i] = dzero();
          runs[i] = {vzero(), vzero()};
        }
        const T* const* next = rows_to_prefetch(t, 0, pass1_rows);
        if (const int64_t ahead = t + kRowStartBlocksAhead * block_tokens; ahead < stop) {
          prefetch_row_starts(block_res, partial_block, ahead, rows, blocks, hidden);
        }
        for (int64_t tile = 0; tile < tiles.h_tile_num; ++tile) {
          if (in_runs) {
            if constexpr (sizeof(T) == 2) {  // in_runs is never true for float32
              add_runs_rows<true>(token_rows, rows, static_cast<const T*>(nullptr), narrow_w.data(), tiles.begin(tile),
                                  tiles.end(tile), hidden, runs.data(), square_lanes.data(), score_lanes.data(), next);
            }
          } else {
            dot_lanes_rows<true>(token_rows, rows, static_cast<const double*>(nullptr), w.data(), tiles.begin(tile),
                                 tiles.end(tile), square_lanes.data(), score_lanes.data(), next);
          }
        }
        for (int64_t i = 0; i < rows; ++i) {
          square_sums[i] = lane_sum(square_lanes[i]);
          score_sums[i] = lane_sum(score_lanes[i]);
        }
        if (in_runs) {
          resum_rows_that_lost_bits(token_rows, rows, w.data(), hidden, square_sums.data(), score_sums.data());
        }
        norms_and_softmax(square_sums.data(), score_sums.data(), rows, hidden, args.norm_eps,
                          inv_norm.data() + (t - t0) * rows, probs.data() + (t - t0) * rows, scores.data());
        numbers[t - t0] =
            kNumberStores<T> && outputs_are_numbers(square_sums.data(), probs.data() + (t - t0) * rows, rows);
      }
      // Pass 2: the weighted sum, rows still in cache.
      for (int64_t t = t0; t < t1; ++t) {
        const T* const* token_rows = row_ptrs.data() + (t - t0) * rows;
        const float* p = probs.data() + (t - t0) * rows;
        const T* const* next = rows_to_prefetch(t, pass1_rows, rows);
        if (stream) {
          weighted_sum_tiles<true>(numbers[t - t0], tiles, token_rows, p, rows, hidden_states + t * hidden, next);
        } else {
          weighted_sum_tiles<false>(numbers[t - t0], tiles, token_rows, p, rows, hidden_states + t * hidden, next);
        }
      }
      if (args.inv_norm != nullptr) {
        std::memcpy(args.inv_norm + t0 * rows, inv_norm.data(), (t1 - t0) * rows * sizeof(float));
        std::memcpy(args.probs + t0 * rows, probs.data(), (t1 - t0) * rows * sizeof(float));
      }
    }
    if (stream) stream_fence();  // this task's streaming stores are visible when the call returns
  };
  parallel_tasks(args.used_core_num, max_threads, core_task);
}

}  // namespace

void forward(const ForwardArgs& args, int max_threads) {
  switch (args.dtype) {
    case DType::kFloat32:
      forward_impl<float>(args, max_threads);
      break;
    case DType::kFloat16:
      forward_impl<FP16>(args, max_threads);
      break;
    case DType::kBFloat16:
      forward_impl<BF16>(args, max_threads);
      break;
  }
}
