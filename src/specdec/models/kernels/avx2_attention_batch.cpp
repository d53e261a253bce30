// One layer's attention for every sequence of a batched forward, in one call.
//
// Why: decoder.attention runs about a dozen small torch ops per sequence and layer; from Python each costs
// microseconds of dispatch, so at 32 decoding sequences the loop over sequences cost more than the attention
// arithmetic (about 60 ms of a 300 ms step for Gemma 3 270M). This runs the ops of decoder.attention (the KV
// write, qk_scores, scale, tree gather, mask, softmax, bfloat16 rounding, probs_values) in C++, and small
// sequences run on the threads side by side instead of one after another.
//
// Each query row reads only its attention span of the cache (attention_span below) rather than the whole
// buffer: a sliding-window layer reads about one window, a global layer the slots up to the row's own
// (rounded up). A row's bits equal decoder.attention over that span (test_attention_batch_kernel.py).
#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/tensor.h>
#include <ATen/Parallel.h>
#include <ATen/ThreadLocalState.h>
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <exception>
#include <limits>
#include <utility>
#include <vector>

#include "avx2_bf16.h"

at::Tensor qk_scores_at(at::Tensor q, at::Tensor keys_t, int64_t first, int64_t count);
at::Tensor probs_values_at(at::Tensor probs, at::Tensor values, at::Tensor order, int64_t tokens, int64_t first);
void qk_scores_slots(const float* q, int64_t rows, const uint16_t* keys, int64_t dim, int64_t stride, float* out,
                     int64_t ldo, int64_t s0, int64_t s1, specdec_bf16::Prefetcher* pf);
void probs_values_rows4_dims(const uint16_t* const* prows, const uint16_t* vhead, int64_t first, int64_t slots,
                             int64_t dim, uint16_t* const* outs, int64_t d0, int64_t dims);
void probs_values_row(const uint16_t* prow, const int64_t* orow, const uint16_t* vhead, int64_t first,
                      int64_t slots, int64_t dim, uint16_t* out);
void probs_values_rows4_ordered(const uint16_t* const* prows, const int64_t* orow, const uint16_t* vhead,
                                int64_t slots, int64_t dim, uint16_t* const* outs);
void probs_values_rows4(const uint16_t* const* prows, const uint16_t* vhead, int64_t first, int64_t slots,
                        int64_t dim, uint16_t* const* outs, specdec_bf16::Prefetcher* pf);
void softmax_row_bf16(const float* s, int64_t len, int64_t first, float* e, uint16_t* out);
at::Tensor softmax_rows(at::Tensor scores, int64_t first);
#ifdef SPECDEC_AMX
bool amx_values_ready(int64_t dim);
void amx_attention_tiles_enter();
void amx_attention_tiles_leave();
bool amx_probs_values(const uint16_t* const* prows, const int64_t* const* orows, int64_t nr, const uint16_t* vhead,
                      int64_t first, int64_t slots, int64_t dim, uint16_t* const* outs, int64_t d0, int64_t dims);
bool amx_values_rows(const uint16_t* const* prows, const int64_t* const* orows, int64_t nr, const uint16_t* vt,
                     int64_t capacity, int64_t first, int64_t slots, int64_t dim, uint16_t* const* outs, int64_t d0,
                     int64_t dims);
bool amx_score_rows(const float* q, int64_t rows, const uint16_t* krows, int64_t readable, int64_t dim, float* out,
                    int64_t ldo, int64_t s0, int64_t s1);
#endif

namespace {

using specdec_bf16::bf16_to_float;

// A sequence with more rows than this runs alone, with the kernels' own threads (a prefill chunk).
constexpr int64_t kSmallRows = 16;
// Query rows per task when one sequence's rows are split over the threads.
constexpr int64_t kRowBlock = 16;
// A decoding sequence's span is split over the threads in parts of at least this many slots.
constexpr int64_t kSlotPart = 96;
// Attention spans (see attention_span) start and end on whole groups of this many slots.
constexpr int64_t kSpanStep = 16;

int64_t round_up(int64_t x, int64_t step) { return (x + step - 1) / step * step; }

// The columns [first, end) a query row reads, from the last column it may see (`reach`: its own slot, or for
// a tree in slot order its own depth's column), the buffer's capacity and the layer's window (-1: none):
// the row's visible columns, widened to whole 16-slot groups. Columns in the span the row may not see are
// masked (-inf, probability exactly 0), and the softmax (avx2_softmax.cpp) sums each column into the lane of
// its slot, so a token's attention has the same bits over any span that holds what it sees: in plain
// decoding, in a verified chain or tree and in a prefill chunk, whatever shares the call.
std::pair<int64_t, int64_t> attention_span(int64_t reach, int64_t capacity, int64_t window) {
  const int64_t end = std::min(capacity, round_up(reach + 1, kSpanStep));
  if (window < 0) return {0, end};
  return {std::max<int64_t>(0, reach - window + 1) / kSpanStep * kSpanStep, end};
}

// Rows [lo, hi) of one sequence that share one span, through qk, mask, softmax and probs x values.
void span_rows(const at::Tensor& qs_all, const at::Tensor& keys_t, const at::Tensor& values, const at::Tensor& mask,
               const at::Tensor& order, const at::Tensor& rows, int64_t first, int64_t end, int64_t reach_end,
               int64_t t, int64_t kv_heads, int64_t groups, double scale, at::Tensor& out_rows) {
  const int64_t n = rows.size(0), dim = qs_all.size(2), heads = kv_heads * groups, len = end - first;
  const auto qs = qs_all.index_select(0, rows).view({n, kv_heads, groups, dim}).permute({1, 2, 0, 3})
                      .reshape({kv_heads, groups * n, dim});
  // mask rows are (group, token): token rows of every group
  const auto mask_rows = at::arange(groups, rows.options()).mul_(t).unsqueeze(1).add(rows.unsqueeze(0)).flatten();
  const auto m = mask.index_select(0, mask_rows).narrow(1, first, len);
  const bool tree = order.numel() > 0;
  at::Tensor scores, span_order;
  if (tree) {  // columns read slots anywhere in [first, reach_end): score those, then gather per token
    span_order = order.index_select(0, rows).narrow(1, first, len).contiguous();
    scores = qk_scores_at(qs, keys_t, first, reach_end - first).mul_(scale);
    scores = scores.gather(-1, span_order.sub(first).repeat({groups, 1}).expand({kv_heads, -1, -1}));
  } else {
    scores = qk_scores_at(qs, keys_t, first, len).mul_(scale);
  }
  const auto probs = softmax_rows(scores.add_(m), first);
  const auto pv = probs_values_at(probs, values, tree ? span_order : order, n, first);
  out_rows.index_copy_(0, rows, pv.view({kv_heads, groups, n, dim}).permute({2, 0, 1, 3}).reshape({n, heads * dim}));
}

#ifdef SPECDEC_AMX
// probs x values of every value head's gn rows (row hr = h * gn + i) on AMX tiles, all of a head's rows in one
// call, the heads' dims in parts on the threads: from the cache's dim-major values where it stores the tile
// layout (`vtp`, amx_values_rows), else from the values laid out so in a copy (amx_probs_values); the same bits.
template <typename P, typename O, typename Out>
void values_on_tiles(int64_t kv_heads, int64_t gn, int64_t dim, int64_t capacity, const uint16_t* vp,
                     const uint16_t* vtp, int64_t first, int64_t len, int64_t threads, P prow_of, O order_of,
                     Out out_of) {
  const int64_t parts = std::clamp<int64_t>((threads + kv_heads - 1) / kv_heads, 1, dim / 16);
  const int64_t dims = (dim / 16 + parts - 1) / parts * 16;
  at::parallel_for(0, kv_heads * parts, 1, [&](int64_t t0, int64_t t1) {
    static thread_local std::vector<const uint16_t*> prows;
    static thread_local std::vector<const int64_t*> orows;
    static thread_local std::vector<uint16_t*> outs;
    prows.resize(static_cast<size_t>(gn));
    orows.resize(static_cast<size_t>(gn));
    outs.resize(static_cast<size_t>(gn));
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t h = t / parts, d0 = (t % parts) * dims;
      if (d0 >= dim) continue;
      for (int64_t i = 0; i < gn; ++i) {
        prows[i] = prow_of(h * gn + i);
        orows[i] = order_of(h * gn + i);
        outs[i] = out_of(h * gn + i);
      }
      if (vtp != nullptr)
        amx_values_rows(prows.data(), orows.data(), gn, vtp + h * dim * capacity, capacity, first, len, dim,
                        outs.data(), d0, std::min(dims, dim - d0));
      else
        amx_probs_values(prows.data(), orows.data(), gn, vp + h * capacity * dim, first, len, dim, outs.data(), d0,
                         std::min(dims, dim - d0));
    }
  });
}
#endif

// How many leading columns of a tree row's order read the slots in slot order (orow[c] == first + c: the
// context, up to the tree's own slots). Those columns' scores need no gather.
inline int64_t slot_order_prefix(const int64_t* orow, int64_t first, int64_t len) {
  int64_t c = 0;
  __m256i want = _mm256_setr_epi64x(first, first + 1, first + 2, first + 3);
  const __m256i four = _mm256_set1_epi64x(4);
  for (; c + 4 <= len; c += 4) {
    const __m256i got = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(orow + c));
    if (_mm256_movemask_epi8(_mm256_cmpeq_epi64(got, want)) != -1) break;
    want = _mm256_add_epi64(want, four);
  }
  while (c < len && orow[c] == first + c) ++c;
  return c;
}

// span_rows with the same arithmetic on raw pointers and no tensor op: rows that read the cache in slot
// order, or a verified tree's rows in their tree order (`order`, scored up to `reach_end`). A decoding
// sequence ran about fifteen small tensor ops per layer through span_rows, microseconds each: at 32
// sequences that was a fifth of a decode step. Needs contiguous cache buffers and mask, and q's last axis
// contiguous. `mp`: the additive mask [groups * t, capacity], or null for a chain after `chain_slot`
// committed tokens, whose mask (chain_mask's) is applied as it is read instead of being built.
// qp: the sequence's first query row ([t, heads, dim] with strides q_row, q_head, 1); op: its first output
// row (stride out_row).
void span_rows_in_slot_order(const uint16_t* qp, int64_t q_row, int64_t q_head, const at::Tensor& keys_t,
                             const at::Tensor& values, const float* mp, int64_t chain_slot, int64_t window,
                             const std::vector<int64_t>& rows, int64_t first, int64_t end, int64_t t, int64_t kv_heads,
                             int64_t groups, double scale, uint16_t* op, int64_t out_row, specdec_bf16::Prefetcher* pf,
                             const int64_t* order = nullptr, int64_t reach_end = 0,
                             const uint16_t* krows = nullptr, const uint16_t* vtp = nullptr) {
  const int64_t n = static_cast<int64_t>(rows.size()), dim = keys_t.size(1), len = end - first;
  const int64_t capacity = keys_t.size(2), gn = groups * n;
  // A tree in slot order (order [t, capacity]: the slot each column of a row reads) scores every slot its
  // columns may read, [first, reach_end), then gathers each row's columns, as span_rows does with tensor ops.
  const bool tree = order != nullptr;
  const int64_t scored = tree ? reach_end - first : len;
  TORCH_CHECK(!tree || (mp != nullptr && scored >= len), "a tree needs its mask and a reach past its span");
  // query rows as float32 (exact) in (kv head, group, row) order, as span_rows lays them out
  std::vector<float> qf(kv_heads * gn * dim);
  for (int64_t h = 0; h < kv_heads * groups; ++h)
    for (int64_t j = 0; j < n; ++j) {
      const uint16_t* src = qp + rows[j] * q_row + h * q_head;
      float* dst = qf.data() + (h * n + j) * dim;
      for (int64_t d = 0; d < dim; ++d) dst[d] = bf16_to_float(src[d]);
    }
  std::vector<float> scores(static_cast<size_t>(kv_heads * gn * scored));
  float* sp = scores.data();
  const auto* kp = reinterpret_cast<const uint16_t*>(keys_t.data_ptr<at::BFloat16>()) + first;
  const float fscale = static_cast<float>(scale);
  const float hidden = -std::numeric_limits<float>::infinity();
  // Blocks of rows on the threads (a prefill chunk's hundreds of rows), and where those leave a thread idle
  // (one decoding sequence's rows are one block) the span's slots in parts as well; inside attention_batch's
  // own parallel region these loops run serially. Every score is its own chain and every probs x values
  // element too, so neither split changes a bit.
  const int64_t blocks = (gn + kRowBlock - 1) / kRowBlock;
  const int64_t threads = at::in_parallel_region() ? 1 : at::get_num_threads();
  const int64_t parts = kv_heads * blocks >= threads ? 1 : std::max<int64_t>(1, std::min(threads, scored / kSlotPart));
  const int64_t part_len = round_up((scored + parts - 1) / parts, 48);  // whole AVX512 groups of 48 slots
  at::parallel_for(0, kv_heads * blocks * parts, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t h = b / (blocks * parts), block = (b / parts) % blocks;
      const int64_t r0 = block * kRowBlock, r1 = std::min(gn, r0 + kRowBlock);
      const int64_t c0 = std::min(scored, (b % parts) * part_len), c1 = std::min(scored, c0 + part_len);
#ifdef SPECDEC_AMX
      if (krows != nullptr)  // the cache's slot-major keys: no repacking (amx_qk_scores.cpp), the same bits
        amx_score_rows(qf.data() + (h * gn + r0) * dim, r1 - r0, krows + (h * capacity + first) * dim,
                       capacity - first, dim, sp + (h * gn + r0) * scored, scored, c0, c1);
      else
#endif
        qk_scores_slots(qf.data() + (h * gn + r0) * dim, r1 - r0, kp + h * dim * capacity, dim, capacity,
                        sp + (h * gn + r0) * scored, scored, c0, c1, pf);
      if (tree) continue;  // scaled and masked once gathered, below
      // scores * scale, then + mask: two roundings, as mul_ and add_ (no contraction: -ffp-contract=off)
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t g = r / n, j = r % n;
        float* row = sp + (h * gn + r) * len;
        if (mp) {
          const float* mrow = mp + (g * t + rows[j]) * capacity + first;
          for (int64_t c = c0; c < c1; ++c) {
            const float scaled = row[c] * fscale;
            row[c] = scaled + mrow[c];
          }
        } else {  // chain_mask's values: 0 for the slots [low, reach] the token sees, -inf elsewhere
          const int64_t reach = chain_slot + rows[j];
          const int64_t low = window < 0 ? 0 : std::max<int64_t>(0, reach - window + 1);
          for (int64_t c = c0; c < c1; ++c) {
            const float scaled = row[c] * fscale;
            row[c] = scaled + (first + c >= low && first + c <= reach ? 0.0f : hidden);
          }
        }
      }
    }
  });
  std::vector<uint16_t> pb(kv_heads * gn * len);  // the probabilities, rounded to bfloat16
  const auto* vp = reinterpret_cast<const uint16_t*>(values.data_ptr<at::BFloat16>());
  auto out_of = [&](int64_t hr) {  // hr = (h * groups + g) * n + j
    const int64_t h = hr / gn, g = (hr % gn) / n, j = hr % n;
    return op + rows[j] * out_row + (h * groups + g) * dim;
  };
#ifdef SPECDEC_AMX
  const bool tiles = amx_values_ready(dim);  // every row's values on tiles (amx_probs_values.cpp)
#else
  const bool tiles = false;
#endif
  if (tree) {  // per token: each query head's row gathers its columns' scores, * scale + mask, softmax; then
    // the values, read in the token's slot order, for its query heads of one KV head four at a time (each
    // value vector loaded once for the four: one row at a time, a 16-node tree's attention over 2k tokens
    // took a fifth longer than a 16-row chain's)
    at::parallel_for(0, kv_heads * n, 1, [&](int64_t u0, int64_t u1) {
      std::vector<float> row(static_cast<size_t>(len)), e(static_cast<size_t>(len));
      for (int64_t u = u0; u < u1; ++u) {
        const int64_t h = u / n, j = u % n;
        const int64_t* orow = order + rows[j] * capacity + first;
        const int64_t same = slot_order_prefix(orow, first, len);  // the context: column c reads slot first + c
        for (int64_t c = same; c < len; ++c)
          TORCH_CHECK(orow[c] >= first && orow[c] - first < scored,
                      "a tree column reads a slot outside its scored span");
        for (int64_t g = 0; g < groups; ++g) {
          const int64_t hr = (h * groups + g) * n + j;
          const float* mrow = mp + (g * t + rows[j]) * capacity + first;
          const float* full = sp + hr * scored;
          for (int64_t c = 0; c < same; ++c) {  // a straight loop the compiler vectorizes
            const float scaled = full[c] * fscale;
            row[c] = scaled + mrow[c];
          }
          for (int64_t c = same; c < len; ++c) {
            const float scaled = full[orow[c] - first] * fscale;
            row[c] = scaled + mrow[c];
          }
          softmax_row_bf16(row.data(), len, first, e.data(), pb.data() + hr * len);
        }
        if (tiles) continue;  // below, every token's rows together
        const uint16_t* vhead = vp + h * capacity * dim;
        int64_t g = 0;
        for (; g + 4 <= groups; g += 4) {
          const int64_t hr[4] = {(h * groups + g) * n + j, (h * groups + g + 1) * n + j, (h * groups + g + 2) * n + j,
                                 (h * groups + g + 3) * n + j};
          const uint16_t* prows[4] = {pb.data() + hr[0] * len, pb.data() + hr[1] * len, pb.data() + hr[2] * len,
                                      pb.data() + hr[3] * len};
          uint16_t* outs[4] = {out_of(hr[0]), out_of(hr[1]), out_of(hr[2]), out_of(hr[3])};
          probs_values_rows4_ordered(prows, orow, vhead, len, dim, outs);
        }
        for (; g < groups; ++g) {
          const int64_t hr = (h * groups + g) * n + j;
          probs_values_row(pb.data() + hr * len, orow, vhead, first, len, dim, out_of(hr));
        }
      }
    });
#ifdef SPECDEC_AMX
    if (tiles)  // row hr = (h * groups + g) * n + j reads token j's order
      values_on_tiles(kv_heads, gn, dim, capacity, vp, vtp, first, len, threads,
                      [&](int64_t hr) -> const uint16_t* { return pb.data() + hr * len; },
                      [&](int64_t hr) -> const int64_t* { return order + rows[hr % n] * capacity + first; }, out_of);
#endif
    return;
  }
#ifdef SPECDEC_AMX
  if (tiles) {
    at::parallel_for(0, kv_heads * gn, kRowBlock, [&](int64_t r0, int64_t r1) {
      std::vector<float> e(static_cast<size_t>(len));
      for (int64_t hr = r0; hr < r1; ++hr) softmax_row_bf16(sp + hr * len, len, first, e.data(), pb.data() + hr * len);
    });
    values_on_tiles(kv_heads, gn, dim, capacity, vp, vtp, first, len, threads,
                    [&](int64_t hr) -> const uint16_t* { return pb.data() + hr * len; },
                    [](int64_t) -> const int64_t* { return nullptr; }, out_of);
    return;
  }
#endif
  // One decoding sequence's rows (a block or less, in fours per value head): the softmax, then each four
  // rows' values in parts of the head's dims on the threads (one block alone would leave a thread idle).
  const int64_t dim_parts = std::min<int64_t>(threads, dim / 64);
  if (parts > 1 && dim_parts > 1 && dim % 64 == 0 && gn % 4 == 0) {
    {
      std::vector<float> e(static_cast<size_t>(len));
      for (int64_t hr = 0; hr < kv_heads * gn; ++hr) softmax_row_bf16(sp + hr * len, len, first, e.data(), pb.data() + hr * len);
    }
    const int64_t dims = (dim / 64 + dim_parts - 1) / dim_parts * 64;  // per part, whole 64s
    at::parallel_for(0, kv_heads * gn / 4 * dim_parts, 1, [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b) {
        const int64_t hr = b / dim_parts * 4, d0 = (b % dim_parts) * dims;
        if (d0 >= dim) continue;
        const uint16_t* prows[4] = {pb.data() + hr * len, pb.data() + (hr + 1) * len, pb.data() + (hr + 2) * len,
                                    pb.data() + (hr + 3) * len};
        uint16_t* outs[4] = {out_of(hr), out_of(hr + 1), out_of(hr + 2), out_of(hr + 3)};
        probs_values_rows4_dims(prows, vp + (hr / gn) * capacity * dim, first, len, dim, outs, d0,
                                std::min(dims, dim - d0));
      }
    });
    return;
  }
  at::parallel_for(0, kv_heads * gn, kRowBlock, [&](int64_t r0, int64_t r1) {
    std::vector<float> e(static_cast<size_t>(len));
    for (int64_t hr = r0; hr < r1; ++hr) softmax_row_bf16(sp + hr * len, len, first, e.data(), pb.data() + hr * len);
    int64_t hr = r0;
    for (; hr + 4 <= r1; hr += 4) {  // four rows of one value head at a time (a decode step's query heads)
      if (hr / gn != (hr + 3) / gn) break;
      const uint16_t* prows[4] = {pb.data() + hr * len, pb.data() + (hr + 1) * len, pb.data() + (hr + 2) * len,
                                  pb.data() + (hr + 3) * len};
      uint16_t* outs[4] = {out_of(hr), out_of(hr + 1), out_of(hr + 2), out_of(hr + 3)};
      probs_values_rows4(prows, vp + (hr / gn) * capacity * dim, first, len, dim, outs, pf);
    }
    for (; hr < r1; ++hr)
      probs_values_row(pb.data() + hr * len, nullptr, vp + (hr / gn) * capacity * dim, first, len, dim, out_of(hr));
  });
}

// The additive mask of a chain of t rows after `slot` committed tokens (committed slot s holds position s):
// row i sees slots s <= slot + i within the window, as runtime.decoder_input's build_mask gives it. The
// runtime passes no mask for a chain (building it took about ten small tensor ops per sequence and step).
at::Tensor chain_mask(const int64_t* positions, int64_t t, int64_t groups, int64_t capacity, int64_t slot,
                      int64_t window) {
  for (int64_t i = 0; i < t; ++i)
    TORCH_CHECK(positions[i] == slot + i, "a sequence without a mask must be a chain after its committed tokens");
  auto mask = at::empty({groups * t, capacity}, at::TensorOptions().dtype(at::kFloat));
  float* mp = mask.data_ptr<float>();
  const float hidden = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < t; ++i) {
    const int64_t reach = slot + i;
    const int64_t low = window < 0 ? 0 : std::max<int64_t>(0, reach - window + 1);
    for (int64_t g = 0; g < groups; ++g) {
      float* row = mp + (g * t + i) * capacity;
      for (int64_t s = 0; s < capacity; ++s) row[s] = s >= low && s <= reach ? 0.0f : hidden;
    }
  }
  return mask;
}

// One token's key or value vector into a cache buffer: slot-major [heads, capacity, dim] (one copy) or
// dim-major [heads, dim, capacity] (one element in each dim's row).
inline void put_slot(uint16_t* buf, bool slot_major, int64_t h, int64_t slot, int64_t dim, int64_t capacity,
                     const uint16_t* src) {
  if (slot_major) {
    std::memcpy(buf + (h * capacity + slot) * dim, src, dim * sizeof(uint16_t));
  } else {
    for (int64_t d = 0; d < dim; ++d) buf[(h * dim + d) * capacity + slot] = src[d];
  }
}

void one_sequence(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& keys_t,
                  const at::Tensor& values, const at::Tensor& given_mask, const at::Tensor& order,
                  const int64_t* positions, int64_t start, int64_t end, int64_t slot, int64_t window,
                  double scale, at::Tensor& out, specdec_bf16::Prefetcher* pf, const at::Tensor& keys_rows,
                  const at::Tensor& values_t) {
  const int64_t t = end - start, kv_heads = keys_t.size(0), heads = q.size(1);
  const int64_t groups = heads / kv_heads, capacity = keys_t.size(2), dim = keys_t.size(1);
  TORCH_CHECK(slot >= 0 && slot + t <= capacity, "pending slots outside the cache");
  const bool given = given_mask.numel() > 0;
  if (given) {
    TORCH_CHECK(given_mask.dim() == 2 && given_mask.size(0) == groups * t && given_mask.size(1) == capacity,
                "mask [groups * T, capacity]");
  } else {
    for (int64_t i = 0; i < t; ++i)
      TORCH_CHECK(positions[start + i] == slot + i, "a sequence without a mask must be a chain after its committed tokens");
  }
  TORCH_CHECK(order.numel() == 0 || (order.dim() == 2 && order.size(0) == t && order.size(1) == capacity),
              "order [T, capacity]");
  const bool ordered = order.numel() > 0;
  // Raw pointers (no tensor op per sequence and layer) where the layouts allow, as for every decode step and
  // every verified tree (its mask given, its order contiguous int64).
  // With the tile layout (the AMX build's cache, kv_cache.py) keys_t and values are transposed views of
  // keys_rows and values_t: the raw path then writes and reads those.
  const bool tiled = keys_rows.defined() && keys_rows.numel() > 0;
  if (tiled)
    TORCH_CHECK(keys_rows.is_contiguous() && values_t.is_contiguous() && keys_rows.dim() == 3 &&
                    keys_rows.size(0) == kv_heads && keys_rows.size(1) == capacity && keys_rows.size(2) == dim &&
                    values_t.dim() == 3 && values_t.size(0) == kv_heads && values_t.size(1) == dim &&
                    values_t.size(2) == capacity && keys_rows.scalar_type() == at::kBFloat16 &&
                    values_t.scalar_type() == at::kBFloat16,
                "the tile layout: keys_rows [kv_heads, capacity, dim] and values_t [kv_heads, dim, capacity], contiguous");
  const bool raw = (!ordered || (given && order.is_contiguous() && order.scalar_type() == at::kLong)) &&
                   (tiled || (keys_t.is_contiguous() && values.is_contiguous())) &&
                   (!given || given_mask.is_contiguous()) && q.stride(2) == 1 && k.stride(2) == 1 &&
                   v.stride(2) == 1 && out.is_contiguous();
  // KVCache.write: pending slots [slot, slot + t), keys dim-major and values slot-major, or in the tile layout
  // the other way round
  if (raw) {
    const at::Tensor& kt = tiled ? keys_rows : keys_t;
    const at::Tensor& vt = tiled ? values_t : values;
    auto* kb = reinterpret_cast<uint16_t*>(kt.data_ptr<at::BFloat16>());
    auto* vb = reinterpret_cast<uint16_t*>(vt.data_ptr<at::BFloat16>());
    const auto* kp = reinterpret_cast<const uint16_t*>(k.data_ptr<at::BFloat16>());
    const auto* vp = reinterpret_cast<const uint16_t*>(v.data_ptr<at::BFloat16>());
    for (int64_t i = 0; i < t; ++i)
      for (int64_t h = 0; h < kv_heads; ++h) {
        put_slot(kb, tiled, h, slot + i, dim, capacity, kp + (start + i) * k.stride(0) + h * k.stride(1));
        put_slot(vb, !tiled, h, slot + i, dim, capacity, vp + (start + i) * v.stride(0) + h * v.stride(1));
      }
  } else {
    keys_t.narrow(2, slot, t).copy_(k.narrow(0, start, t).permute({1, 2, 0}));
    values.narrow(1, slot, t).copy_(v.narrow(0, start, t).transpose(0, 1));
  }
  // each row's reach: its own slot, or in a slot-ordered tree its depth's column (positions are committed +
  // depth); a tree read in plain slot order (drafters) may see ancestors anywhere in its pending slots
  const int64_t* pp = positions + start;
  bool chain = true;
  int64_t low = pp[0];
  for (int64_t i = 0; i < t; ++i) chain = chain && pp[i] == pp[0] + i, low = std::min(low, pp[i]);
  std::vector<std::pair<std::pair<int64_t, int64_t>, int64_t>> spans(t);  // ((first, end), row)
  for (int64_t i = 0; i < t; ++i) {
    auto span = attention_span(ordered ? slot + pp[i] - low : slot + i, capacity, window);
    if (!ordered && !chain) span.first = std::min(span.first, slot);
    spans[i] = {span, i};
  }
  std::stable_sort(spans.begin(), spans.end());
  const at::Tensor mask = raw || given ? given_mask : chain_mask(positions + start, t, groups, capacity, slot, window);
  const auto index = at::TensorOptions().dtype(at::kLong);
  for (size_t a = 0; a < spans.size();) {
    size_t b = a;
    std::vector<int64_t> rows;
    while (b < spans.size() && spans[b].first == spans[a].first) rows.push_back(spans[b++].second);
    const auto [first, stop] = spans[a].first;
    if (raw) {
      span_rows_in_slot_order(reinterpret_cast<const uint16_t*>(q.data_ptr<at::BFloat16>()) + start * q.stride(0),
                              q.stride(0), q.stride(1), keys_t, values, given ? given_mask.data_ptr<float>() : nullptr,
                              slot, window, rows, first, stop, t, kv_heads, groups,
                              scale, reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>()) + start * out.stride(0),
                              out.stride(0), pf, ordered ? order.data_ptr<int64_t>() : nullptr,
                              std::max(stop, slot + t),
                              tiled ? reinterpret_cast<const uint16_t*>(keys_rows.data_ptr<at::BFloat16>()) : nullptr,
                              tiled ? reinterpret_cast<const uint16_t*>(values_t.data_ptr<at::BFloat16>()) : nullptr);
    } else {
      auto out_rows = out.narrow(0, start, t);
      span_rows(q.narrow(0, start, t), keys_t, values, mask, order, at::tensor(rows, index), first, stop,
                std::max(stop, slot + t), t, kv_heads, groups, scale, out_rows);
    }
    a = b;
  }
}

// The key and value lines a decoding sequence's rows will read (their attention span; a tree's rows may read
// a little more, which the prefetch then misses), for the Prefetcher.
void next_reads(const at::Tensor& keys_t, const at::Tensor& values, int64_t t, int64_t slot, int64_t window,
                specdec_bf16::Prefetcher& pf) {
  if (!keys_t.is_contiguous() || !values.is_contiguous() || keys_t.size(0) != 1) return;
  const int64_t capacity = keys_t.size(2), dim = keys_t.size(1);
  auto [first, end] = attention_span(slot + t - 1, capacity, window);
  first = std::min(first, slot);
  const auto* kp = reinterpret_cast<const char*>(keys_t.data_ptr<at::BFloat16>());
  const auto* vp = reinterpret_cast<const char*>(values.data_ptr<at::BFloat16>());
  pf.add(kp + first * 2, (end - first) * 2, capacity * 2, dim);  // [dim, capacity]: one run per d
  pf.add(vp + first * dim * 2, (end - first) * dim * 2, 0, 1);  // [capacity, dim]: one run
}

}  // namespace

// q [N, heads, dim], k and v [N, kv_heads, dim] (bfloat16): the rows of every sequence, one after another,
// and their positions [N]; per sequence i: rows [starts[i], ends[i]), its layer's cache buffers keys_t
// [kv_heads, dim, capacity] and values [kv_heads, capacity, dim], where its pending slots start (slots[i]),
// its additive float32 mask [groups * T, capacity] and its tree slot order [T, capacity] (empty for a
// chain); `window` is the layer's sliding window (-1: none). Returns [N, heads * dim].
at::Tensor attention_batch(at::Tensor q, at::Tensor k, at::Tensor v, std::vector<at::Tensor> keys_t,
                           std::vector<at::Tensor> values, std::vector<at::Tensor> masks,
                           std::vector<at::Tensor> orders, std::vector<int64_t> starts, std::vector<int64_t> ends,
                           std::vector<int64_t> slots, at::Tensor positions, int64_t window, double scale,
                           std::vector<at::Tensor> keys_rows, std::vector<at::Tensor> values_t) {
  const int64_t n = static_cast<int64_t>(keys_t.size());
  TORCH_CHECK(static_cast<int64_t>(values.size()) == n && static_cast<int64_t>(masks.size()) == n &&
                  static_cast<int64_t>(orders.size()) == n && static_cast<int64_t>(slots.size()) == n &&
                  static_cast<int64_t>(starts.size()) == n && static_cast<int64_t>(ends.size()) == n,
              "one cache, mask, order, row span and slot per sequence");
  TORCH_CHECK(keys_rows.size() == values_t.size() && (keys_rows.empty() || static_cast<int64_t>(keys_rows.size()) == n),
              "the tile layout: none, or one pair per sequence");
  const at::Tensor none_given;
  auto tile_buffer = [&](const std::vector<at::Tensor>& list, int64_t i) -> const at::Tensor& {
    return list.empty() || !list[i].defined() ? none_given : list[i];
  };
  TORCH_CHECK(q.scalar_type() == at::kBFloat16 && q.dim() == 3 && k.dim() == 3 && v.dim() == 3, "bfloat16 q, k, v");
  auto out = at::empty({q.size(0), q.size(1) * q.size(2)}, q.options());
  TORCH_CHECK(positions.dim() == 1 && positions.size(0) == q.size(0), "one position per row");
  const auto positions_long = positions.to(at::kLong).contiguous();
  const int64_t* pos = positions_long.data_ptr<int64_t>();
  std::vector<int64_t> small, large;
  for (int64_t i = 0; i < n; ++i) (ends[i] - starts[i] <= kSmallRows ? small : large).push_back(i);
  if (small.size() == 1) large.push_back(small[0]), small.clear();  // no team for one: see below
  for (int64_t i : large)
    one_sequence(q, k, v, keys_t[i], values[i], masks[i], orders[i], pos, starts[i], ends[i], slots[i], window,
                 scale, out, nullptr, tile_buffer(keys_rows, i), tile_buffer(values_t, i));
  const int64_t m = static_cast<int64_t>(small.size());
  // Inside this region torch's and our kernels' own parallel loops run serially (in_parallel_region), and
  // nothing they compute depends on the thread count. (A region serialised by an `if` clause would not count
  // as parallel, and the loops inside would start a nested team on every call: milliseconds each.) An exception may not leave an OpenMP region: the
  // first one is kept and rethrown after it.
  std::exception_ptr error;
  const at::ThreadLocalState caller;  // grad / inference mode and the rest, as at::parallel_for passes them on
  // Each thread gets its own list of sequences, balanced by their work (rows x span: the sequences of a
  // batch differ several-fold in context, and with a round-robin one thread waited for the other for about a
  // third of the step's attention), and prefetches its next sequence's keys and values while it computes
  // this one (next_reads).
  const int64_t threads = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), m));
  std::vector<std::vector<int64_t>> lists(static_cast<size_t>(threads));
  {
    std::vector<std::pair<int64_t, int64_t>> by_work;  // (work, sequence), largest first
    for (int64_t i : small) {
      const int64_t rows = ends[i] - starts[i], seen = slots[i] + rows;
      by_work.push_back({rows * (window < 0 ? seen : std::min(seen, window + rows)), i});
    }
    std::stable_sort(by_work.begin(), by_work.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
    std::vector<int64_t> load(static_cast<size_t>(threads), 0);
    for (const auto& [work, i] : by_work) {
      const auto least = std::min_element(load.begin(), load.end()) - load.begin();
      load[least] += work;
      lists[least].push_back(i);
    }
  }
#pragma omp parallel num_threads(threads)
  {
#ifdef SPECDEC_AMX
    // one tile configuration for all of this thread's sequences (amx_attention_tiles.h); the head dim is
    // the model's, the same for every sequence
    const bool tiles = !small.empty() && amx_values_ready(q.size(2));
    if (tiles) amx_attention_tiles_enter();
#endif
    const auto& mine = lists[static_cast<size_t>(omp_get_thread_num())];
    for (size_t j = 0; j < mine.size(); ++j) {
      const int64_t i = mine[j];
      try {
        const at::ThreadLocalStateGuard same_state(caller);
        specdec_bf16::Prefetcher pf;
        if (j + 1 < mine.size()) {
          const int64_t next = mine[j + 1];
          next_reads(keys_t[next], values[next], ends[next] - starts[next], slots[next], window, pf);
        }
        one_sequence(q, k, v, keys_t[i], values[i], masks[i], orders[i], pos, starts[i], ends[i], slots[i],
                     window, scale, out, &pf, tile_buffer(keys_rows, i), tile_buffer(values_t, i));
      } catch (...) {
#pragma omp critical
        if (!error) error = std::current_exception();
      }
    }
#ifdef SPECDEC_AMX
    if (tiles) amx_attention_tiles_leave();
#endif
  }
  if (error) std::rethrow_exception(error);
  return out;
}
