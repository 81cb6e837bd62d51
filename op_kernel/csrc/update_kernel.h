// Native CPU kernel of BlockAttnResUpdate (phase 2 of the two-phase read), executing an
// UpdateTilingData. Included by isa_*.cpp inside an instruction set's namespace, after its target pragma.
//
// Per core of the tiling (a task), token by token:
//   pass 1 over the hidden tiles: p = partial_block + delta (one float32 addition), stored into
//          partial_out; the float64 lanes of p's sum of squares and of its dot with the pseudo-query
//   scalar float64: norm, score, the merged max m = max(logit_max, score), alpha = exp(logit_max - m),
//          beta = exp(score - m), total = exp_sum * alpha + beta (the C library's exp)
//   pass 2 over the hidden tiles: h = numerator * (alpha / total) + p * (beta / total) in float32
//          (a multiply, then a fused multiply-add), stored in delta's dtype
//   with an output norm (BlockAttnResUpdateNorm): pass 2 keeps h in a float32 row of the task's (in the
//          lane layout of delta's dtype), and h = (g * h) * rho, rho its inverse RMS, is stored from it as
//          the general read stores its normed output (kernel_loops.h: inverse_rms, store_normed_row)
// partial_out may be partial_block itself (the torch op updates it in place): pass 1 reads each group
// of partial_block before it writes the same group, and pass 2 reads p back from partial_out, never
// partial_block + delta again. The row of p is still in cache then; it is never streamed.
//
// All float32 rows (partial_block, numerator, p, the query) are in element order, so a bfloat16 group,
// which loads in its own lane layout (lane_element), is put in element order first and back before
// it is stored (bf16_lanes_in_order, bf16_lanes_from_order).

namespace {

// A group of T in element order (lane l = element l), and the reverse.
template <typename T>
inline V16 in_element_order(V16 v) {
  if constexpr (std::is_same<T, BF16>::value) return bf16_lanes_in_order(v);
  return v;
}
template <typename T>
inline V16 in_lane_layout(V16 v) {
  if constexpr (std::is_same<T, BF16>::value) return bf16_lanes_from_order(v);
  return v;
}

// p over [h0, h1) of one token into p_out, and its two sums' lanes.
template <typename T>
inline void updated_stream(const float* partial, const T* delta, const double* query, int64_t h0, int64_t h1,
                           float* p_out, D16& squares, D16& dots) {
  const V16 one = vset(1.0f);  // delta * 1 + partial: exact product, so one rounding, as an addition
  D16 sq = squares, dot = dots;
  int64_t h = h0;
  for (; h + kLanes <= h1; h += kLanes) {
    const V16 p = vfma(in_element_order<T>(vload(delta + h)), one, vload(partial + h));
    vstore(p_out + h, p);
    const D16 wide = widen(p);
    sq = dfma(wide, wide, sq);
    dot = dfma(wide, dload(query + h), dot);
  }
  if (h < h1) {  // the last, partial group (h1 == D), zero padded
    const int64_t n = h1 - h;
    const V16 p = vfma(in_element_order<T>(vload_partial(delta + h, n)), one, vload_partial(partial + h, n));
    vstore_partial(p_out + h, p, n);
    const D16 wide = widen(p);
    sq = dfma(wide, wide, sq);
    dot = dfma(wide, dload(query + h), dot);
  }
  squares = sq;
  dots = dot;
}

// h over [h0, h1) of one token: numerator * a + p * b.
template <bool kStream, typename T>
inline void merged_read(const float* numerator, const float* p, float a, float b, int64_t h0, int64_t h1, T* out) {
  const V16 va = vset(a), vb = vset(b);
  int64_t h = h0;
  for (; h + kLanes <= h1; h += kLanes) {
    const V16 mixed[1] = {in_lane_layout<T>(vfma(vload(numerator + h), va, vmul(vload(p + h), vb)))};
    store_groups<1, kStream>(out + h, mixed);
  }
  if (h < h1) {
    const int64_t n = h1 - h;
    vstore_partial(out + h, in_lane_layout<T>(vfma(vload_partial(numerator + h, n), va,
                                                   vmul(vload_partial(p + h, n), vb))), n);
  }
}

// h over [h0, h1) of one token into a float32 row in the lane layout of T (full groups: the partial
// group's padding is 0 * a + 0 * b = 0, as inverse_rms needs).
template <typename T>
inline void merged_row(const float* numerator, const float* p, float a, float b, int64_t h0, int64_t h1, float* y) {
  const V16 va = vset(a), vb = vset(b);
  for (int64_t h = h0; h < h1; h += kLanes) {
    const int64_t n = std::min(kLanes, h1 - h);
    const V16 mixed = n == kLanes ? vfma(vload(numerator + h), va, vmul(vload(p + h), vb))
                                  : vfma(vload_partial(numerator + h, n), va, vmul(vload_partial(p + h, n), vb));
    vstore(y + h, in_lane_layout<T>(mixed));
  }
}

// max(a, b), NaN if either is NaN (as torch.maximum).
inline double max_or_nan(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) ? a : b;
  return a > b ? a : b;
}

template <typename T>
void update_impl(const UpdateArgs& args, int max_threads) {
  const int64_t hidden = args.hidden;
  std::vector<double> query(padded_hidden(hidden));  // [D_pad] float64, element order, zero padded
  to_wide_lane_layout(args.pseudo_query, hidden, query.data());
  const T* delta = static_cast<const T*>(args.delta);
  T* h_out = static_cast<T*>(args.h);
  const bool stream = args.stream_stores && can_stream<T>(h_out, hidden);
  const HiddenTiles tiles = args.tiles;
  const bool normed = args.output_weight != nullptr;
  std::vector<float> gain(normed ? padded_hidden(hidden) : 0);  // [D_pad], the lane layout of T
  if (normed) float_row_to_lane_layout<T>(args.output_weight, hidden, gain.data());
  parallel_tasks(args.used_core_num, max_threads, [&](int64_t core) {
    std::vector<float> y(normed ? padded_hidden(hidden) : 0);  // this task's h row before its norm
    int64_t start, stop;
    core_range(core, args.former_core_num, args.former_core_tokens, args.tail_core_tokens, &start, &stop);
    for (int64_t t = start; t < stop; ++t) {
      const int64_t row = t * hidden;
      D16 squares = dzero(), dots = dzero();
      for (int64_t tile = 0; tile < tiles.h_tile_num; ++tile) {
        updated_stream(args.partial_block + row, delta + row, query.data(), tiles.begin(tile), tiles.end(tile),
                       args.partial_out + row, squares, dots);
      }
      const double norm = std::sqrt(lane_sum(squares) / static_cast<double>(hidden) + static_cast<double>(args.eps));
      const double score = lane_sum(dots) / norm;
      const double prior = args.logit_max[t];
      const double top = max_or_nan(prior, score);
      const double alpha = std::exp(prior - top), beta = std::exp(score - top);  // the same call on every path
      const double total = static_cast<double>(args.exp_sum[t]) * alpha + beta;
      const float a = static_cast<float>(alpha / total), b = static_cast<float>(beta / total);
      if (normed) {
        for (int64_t tile = 0; tile < tiles.h_tile_num; ++tile) {
          merged_row<T>(args.numerator + row, args.partial_out + row, a, b, tiles.begin(tile), tiles.end(tile),
                        y.data());
        }
        const float rho = inverse_rms(y.data(), hidden, padded_hidden(hidden), args.output_eps);
        if (stream) {
          store_normed_row<true>(y.data(), gain.data(), rho, hidden, h_out + row);
        } else {
          store_normed_row<false>(y.data(), gain.data(), rho, hidden, h_out + row);
        }
        continue;
      }
      for (int64_t tile = 0; tile < tiles.h_tile_num; ++tile) {
        if (stream) {
          merged_read<true>(args.numerator + row, args.partial_out + row, a, b, tiles.begin(tile), tiles.end(tile),
                            h_out + row);
        } else {
          merged_read<false>(args.numerator + row, args.partial_out + row, a, b, tiles.begin(tile), tiles.end(tile),
                             h_out + row);
        }
      }
    }
    if (stream) stream_fence();  // this task's streaming stores are visible when the call returns
  });
}

}  // namespace

void update(const UpdateArgs& args, int max_threads) {
  switch (args.dtype) {
    case DType::kFloat32:
      update_impl<float>(args, max_threads);
      break;
    case DType::kFloat16:
      update_impl<FP16>(args, max_threads);
      break;
    case DType::kBFloat16:
      update_impl<BF16>(args, max_threads);
      break;
  }
}
