// The drafters' causal attention over their own KV caches (drafting/eagle3_model.py): every sequence of a
// drafter step in one call (every build). The caches hold float32 or bfloat16; a bfloat16 entry is widened to
// float32 as it is read, so a bfloat16 cache of the drafter's (bfloat16) keys and values gives the float32
// cache's bits at half the bytes read (a tree level over 2,500 entries: 1.46 -> 1.29-1.33 ms on the 2-core Xeon).
//
// Why our own: each sequence attends over its own cache, and in torch that is about six tensor ops per
// sequence, one sequence after another. Here one call runs every row of every sequence, split over the
// threads, and the query heads that share a KV head read its float32 keys and values once: those reads are
// the call's cost (32 caches of 300 entries are 20 MB), and read once per query head the call was no faster
// than torch's ops. At 32 sequences of one row and 300 entries: 0.88 ms against 1.36 ms. The threads split
// each row's keys (its scores) and then its output's dimensions (its values' sums), not only the rows: one
// drafted row over a long prompt (a chain at batch 1) otherwise ran on one thread while the other waited.
//
// Sequence i brings rows[i] new rows, the last rows[i] entries of its cache of L_i entries; new row r attends
// to entries 0 .. L_i - rows[i] + r, or, where the call gives the sequence `slots` (a level of a draft tree,
// whose rows see the context and their own ancestors only), to entries 0 .. P - 1 and then the listed ones:
// slots[i] int64 [rows[i], 1 + W], column 0 P, the rest ascending entries, -1 after the last. Below, t counts
// a row's visible entries in that order. The arithmetic of one row and head, float32, the same whatever
// else is in the call:
//   s[t] = (q . k[t]) * scale, the dot product summed in 8 lanes (dimension d into lane d mod 8, ascending),
//          the lanes then added pairwise (4 = l + (l + 4), then 2, 1);
//   m = max of s; e[t] = exp(s[t] - m) as avx2_exp.h computes it; S = e[0] + e[1] + ... in ascending t;
//   out[d] = (sum over ascending t of e[t] v[t][d]) * (1 / S).
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "avx2_exp.h"

namespace {

inline float lanes_total(__m256 v) {
  const __m128 four = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 two = _mm_add_ps(four, _mm_movehl_ps(four, four));
  return _mm_cvtss_f32(_mm_add_ss(two, _mm_movehdup_ps(two)));
}

// 8 cache values as float32: a float32 cache as stored, a bfloat16 one widened (exactly: its values are the
// drafter's bfloat16 keys and values, so either cache gives every sum the same operands)
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const uint16_t* p) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16));
}

constexpr int kMaxGroup = 8;  // query heads per KV head handled together (more: several passes)

// a head's room for its scores over `visible` entries: a whole number of 8-lane vectors
inline int64_t padded_to_lanes(int64_t visible) { return (visible + 7) / 8 * 8; }

// The scores of `g` query heads (sharing one KV head) over visible entries [t_begin, t_end): each key is read
// once for all of them; each head's dot product is summed as the header documents.
// `at` (null: entry t is visible entry t) maps a visible entry to its cache entry.
template <typename T>
void group_scores(const float* const* q, int g, const T* keys, int64_t t_begin, int64_t t_end, int64_t dim,
                  float* const* s, const int64_t* at) {
  const float* qs[kMaxGroup];  // local copies, as in group_values
  float* out[kMaxGroup];
  for (int j = 0; j < g; ++j) {
    qs[j] = q[j];
    out[j] = s[j];
  }
  for (int64_t t = t_begin; t < t_end; ++t) {
    const T* k = keys + (at ? at[t] : t) * dim;
    __m256 acc[kMaxGroup];
    for (int j = 0; j < g; ++j) acc[j] = _mm256_setzero_ps();
    for (int64_t d = 0; d < dim; d += 8) {
      const __m256 x = load8(k + d);
      for (int j = 0; j < g; ++j) acc[j] = _mm256_add_ps(acc[j], _mm256_mul_ps(_mm256_loadu_ps(qs[j] + d), x));
    }
    for (int j = 0; j < g; ++j) out[j][t] = lanes_total(acc[j]);
  }
}

// scores -> probabilities in place (e: visible floats, room for a multiple of 8): scale, max, exp (avx2_exp.h),
// the sum in ascending t; returns 1 / sum
float softmax_in_place(float* e, int64_t visible, float scale) {
  float m = -std::numeric_limits<float>::infinity();
  for (int64_t t = 0; t < visible; ++t) {
    e[t] = e[t] * scale;
    m = std::max(m, e[t]);
  }
  const int64_t padded = padded_to_lanes(visible);
  std::fill(e + visible, e + padded, -std::numeric_limits<float>::infinity());  // exp gives exactly 0
  const __m256 mv = _mm256_set1_ps(m);
  for (int64_t i = 0; i < padded; i += 8) {
    _mm256_storeu_ps(e + i, specdec_exp::exp8(_mm256_sub_ps(_mm256_loadu_ps(e + i), mv)));
  }
  float total = 0.0f;
  for (int64_t t = 0; t < visible; ++t) total += e[t];
  return 1.0f / total;
}

// The outputs' dimensions [d_begin, d_end) (a multiple of 8 each) of `g` query heads sharing one KV head, from
// their probabilities p (unnormalized exps) and 1 / sum: each head's sum over ascending t, a value chunk read
// once for all of them.
template <typename T>
void group_values(const float* const* p, const float* inverse, int g, const T* values, int64_t visible,
                  int64_t dim, int64_t d_begin, int64_t d_end, float* const* out, const int64_t* at) {
  const float* probs[kMaxGroup];  // local copies: the compiler then keeps them in registers across the loops
  __m256 inv[kMaxGroup];
  for (int j = 0; j < g; ++j) {
    probs[j] = p[j];
    inv[j] = _mm256_set1_ps(inverse[j]);
  }
  for (int64_t d = d_begin; d < d_end; d += 8) {
    __m256 acc[kMaxGroup];
    for (int j = 0; j < g; ++j) acc[j] = _mm256_setzero_ps();
    for (int64_t t = 0; t < visible; ++t) {
      const __m256 v = load8(values + (at ? at[t] : t) * dim + d);
      for (int j = 0; j < g; ++j) acc[j] = _mm256_add_ps(acc[j], _mm256_mul_ps(_mm256_set1_ps(probs[j][t]), v));
    }
    for (int j = 0; j < g; ++j) _mm256_storeu_ps(out[j] + d, _mm256_mul_ps(acc[j], inv[j]));
  }
}

// One unit of a call's work: a new row of one KV head and the (at most kMaxGroup) query heads sharing it
struct Item {
  const float* keys;  // a float32 cache's, or null
  const float* values;
  const uint16_t* keys_bf16;  // a bfloat16 cache's, or null
  const uint16_t* values_bf16;
  const int64_t* at;  // null: visible entry t is cache entry t
  int64_t visible;
  int n_heads;
  const float* qs[kMaxGroup];
  float* outs[kMaxGroup];
  float* scores[kMaxGroup];  // per head, round up to 8 of visible floats: scores, then exps
  float inverse[kMaxGroup];

  int64_t scores_size() const { return n_heads * padded_to_lanes(visible); }

  void scores_of(int64_t t_begin, int64_t t_end, int64_t dim) const {
    if (keys_bf16 != nullptr)
      group_scores(qs, n_heads, keys_bf16, t_begin, t_end, dim, scores, at);
    else
      group_scores(qs, n_heads, keys, t_begin, t_end, dim, scores, at);
  }
  void values_of(int64_t d_begin, int64_t d_end, int64_t dim) const {
    if (values_bf16 != nullptr)
      group_values(scores, inverse, n_heads, values_bf16, visible, dim, d_begin, d_end, outs, at);
    else
      group_values(scores, inverse, n_heads, values, visible, dim, d_begin, d_end, outs, at);
  }
};

// Entries per piece of the scores' work and dimensions per piece of the values' (each a multiple of 8): the
// threads split a row's keys and its output's dimensions, not only the rows, so that a drafting step of one
// row over a long context (a chain's, at batch 1) runs on every thread. No sum is split: a score is one key's,
// and a value piece keeps each dimension's sum over every t in order, so the arithmetic is the header's.
constexpr int64_t kKeysPerPiece = 128;
constexpr int64_t kDimsPerPiece = 64;
// With at least this many items a thread, each item runs whole on one thread (the same arithmetic, one
// parallel section instead of three). Measured on a 2-core Xeon, 2 threads: 1 row over 1,300 entries 0.11 ms
// (0.19 when rows were the only split), 1 row over 4,000 0.38 (0.70); 32 rows over 300 entries 0.62-0.63
// (0.55; the cause of that gap was not found).
constexpr int64_t kItemsPerThreadWhole = 4;

}  // namespace

// q float32 [heads, N, dim] (N = sum of rows); keys[i], values[i] float32 or bfloat16 (all alike)
// [kv_heads, L_i, dim] with unit stride along dim and dim along L (views of a cache's first L_i entries);
// slots: empty (every sequence causal), or one entry per sequence, an empty tensor for a causal one (see the
// header); returns float32 [heads, N, dim].
at::Tensor draft_attention(at::Tensor q, std::vector<at::Tensor> keys, std::vector<at::Tensor> values,
                           std::vector<int64_t> rows, double scale, std::vector<at::Tensor> slots) {
  TORCH_CHECK(q.scalar_type() == at::kFloat && q.dim() == 3 && q.is_contiguous(), "q: contiguous float32 [H, N, D]");
  const int64_t heads = q.size(0), total = q.size(1), dim = q.size(2);
  TORCH_CHECK(dim % 8 == 0, "head_dim must be a multiple of 8");
  const size_t n = keys.size();
  TORCH_CHECK(values.size() == n && rows.size() == n, "one keys, values and rows entry per sequence");
  std::vector<int64_t> first(n + 1, 0);
  for (size_t i = 0; i < n; ++i) first[i + 1] = first[i] + rows[i];
  TORCH_CHECK(first[n] == total, "the rows add up to ", first[n], ", q has ", total);
  TORCH_CHECK(n > 0, "no sequences");
  const bool bf16 = keys[0].scalar_type() == at::kBFloat16;
  TORCH_CHECK(bf16 || keys[0].scalar_type() == at::kFloat, "keys and values: float32 or bfloat16");
  const int64_t kv_heads = keys[0].size(0);
  TORCH_CHECK(kv_heads > 0 && heads % kv_heads == 0, "query heads must be a multiple of the KV heads");
  for (size_t i = 0; i < n; ++i) {
    for (const at::Tensor& t : {keys[i], values[i]}) {
      TORCH_CHECK(t.scalar_type() == keys[0].scalar_type() && t.dim() == 3 && t.size(0) == kv_heads &&
                      t.size(2) == dim && t.stride(2) == 1 && t.stride(1) == dim,
                  "keys and values: [KV, L, D] rows, all float32 or all bfloat16");
    }
    TORCH_CHECK(values[i].size(1) == keys[i].size(1) && keys[i].size(1) >= rows[i] && rows[i] >= 0,
                "sequence ", i, ": its cache must hold its new rows");
  }
  TORCH_CHECK(slots.empty() || slots.size() == n, "slots: none, or one entry per sequence");
  // each row's visible entries where its sequence lists them: [P entries 0 .. P - 1, then the listed ones]
  std::vector<std::vector<int64_t>> listed(static_cast<size_t>(total));
  for (size_t i = 0; i < slots.size(); ++i) {
    if (slots[i].numel() == 0) continue;
    const at::Tensor sl = slots[i].to(at::kLong).contiguous();
    TORCH_CHECK(sl.dim() == 2 && sl.size(0) == rows[i] && sl.size(1) >= 1, "slots[", i, "]: int64 [rows, 1 + W]");
    const int64_t length = keys[i].size(1), width = sl.size(1);
    const int64_t* sp = sl.data_ptr<int64_t>();
    for (int64_t r = 0; r < rows[i]; ++r) {
      const int64_t* row = sp + r * width;
      TORCH_CHECK(row[0] >= 0 && row[0] <= length, "slots[", i, "]: a prefix past the cache");
      std::vector<int64_t>& at = listed[static_cast<size_t>(first[i] + r)];
      for (int64_t t = 0; t < row[0]; ++t) at.push_back(t);
      for (int64_t c = 1; c < width && row[c] >= 0; ++c) {
        TORCH_CHECK(row[c] < length && row[c] > (at.empty() ? -1 : at.back()),
                    "slots[", i, "]: listed entries must be ascending, after the prefix, inside the cache");
        at.push_back(row[c]);
      }
      TORCH_CHECK(!at.empty(), "slots[", i, "]: a row that sees nothing");
    }
  }
  at::Tensor out = at::empty({heads, total, dim}, q.options());
  const float* qp = q.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const int64_t groups = heads / kv_heads;
  const float s = static_cast<float>(scale);
  // one item per (KV head, row, group of at most kMaxGroup query heads): the query heads sharing a KV head
  // read its keys and values once (float32, they are the memory traffic of the call)
  const int64_t passes = (groups + kMaxGroup - 1) / kMaxGroup;
  const int64_t n_items = kv_heads * total * passes;
  // an item's row, KV head, visible entries and query heads (place_scores then gives its heads their scores'
  // room, Item::scores_size() floats)
  const auto make_item = [&](int64_t item, Item& it) {
    const int64_t kv = item / (total * passes), g = (item / passes) % total, pass = item % passes;
    const size_t i = static_cast<size_t>(std::upper_bound(first.begin(), first.end(), g) - first.begin() - 1);
    const std::vector<int64_t>& at = listed[static_cast<size_t>(g)];
    const int64_t length = keys[i].size(1);
    it.keys = bf16 ? nullptr : keys[i].data_ptr<float>() + kv * keys[i].stride(0);
    it.values = bf16 ? nullptr : values[i].data_ptr<float>() + kv * values[i].stride(0);
    const auto half = [&](const at::Tensor& x) {
      return bf16 ? reinterpret_cast<const uint16_t*>(x.data_ptr<at::BFloat16>()) + kv * x.stride(0) : nullptr;
    };
    it.keys_bf16 = half(keys[i]);
    it.values_bf16 = half(values[i]);
    it.at = at.empty() ? nullptr : at.data();
    it.visible = at.empty() ? length - rows[i] + (g - first[i]) + 1 : static_cast<int64_t>(at.size());
    const int first_head = static_cast<int>(kv * groups + pass * kMaxGroup);
    it.n_heads = static_cast<int>(std::min<int64_t>(kMaxGroup, groups - pass * kMaxGroup));
    for (int j = 0; j < it.n_heads; ++j) {
      it.qs[j] = qp + ((first_head + j) * total + g) * dim;
      it.outs[j] = op + ((first_head + j) * total + g) * dim;
    }
  };
  const auto place_scores = [](Item& it, float* scores) {
    for (int j = 0; j < it.n_heads; ++j) it.scores[j] = scores + j * padded_to_lanes(it.visible);
  };
  if (n_items >= kItemsPerThreadWhole * at::get_num_threads()) {  // enough rows to share out whole
    at::parallel_for(0, n_items, 1, [&](int64_t begin, int64_t end) {
      std::vector<float> scores;  // this thread's, item after item
      for (int64_t item = begin; item < end; ++item) {
        Item it;
        make_item(item, it);
        scores.resize(static_cast<size_t>(it.scores_size()));
        place_scores(it, scores.data());
        it.scores_of(0, it.visible, dim);
        for (int j = 0; j < it.n_heads; ++j) it.inverse[j] = softmax_in_place(it.scores[j], it.visible, s);
        it.values_of(0, dim, dim);
      }
    });
    return out;
  }
  std::vector<Item> items(static_cast<size_t>(n_items));
  std::vector<int64_t> score_offset(static_cast<size_t>(n_items) + 1, 0);
  for (int64_t item = 0; item < n_items; ++item) {
    Item& it = items[static_cast<size_t>(item)];
    make_item(item, it);
    score_offset[static_cast<size_t>(item) + 1] = score_offset[static_cast<size_t>(item)] + it.scores_size();
  }
  std::vector<float> score_buffer(static_cast<size_t>(score_offset.back()));
  for (int64_t item = 0; item < n_items; ++item)
    place_scores(items[static_cast<size_t>(item)], score_buffer.data() + score_offset[static_cast<size_t>(item)]);
  // the pieces of the split phases, as (item, first entry or dimension) pairs
  std::vector<std::pair<int64_t, int64_t>> key_pieces, dim_pieces;
  for (int64_t item = 0; item < n_items; ++item) {
    for (int64_t t = 0; t < items[static_cast<size_t>(item)].visible; t += kKeysPerPiece) key_pieces.emplace_back(item, t);
    for (int64_t d = 0; d < dim; d += kDimsPerPiece) dim_pieces.emplace_back(item, d);
  }
  at::parallel_for(0, static_cast<int64_t>(key_pieces.size()), 1, [&](int64_t begin, int64_t end) {
    for (int64_t piece = begin; piece < end; ++piece) {
      const auto [item, t0] = key_pieces[static_cast<size_t>(piece)];
      const Item& it = items[static_cast<size_t>(item)];
      it.scores_of(t0, std::min(it.visible, t0 + kKeysPerPiece), dim);
    }
  });
  at::parallel_for(0, n_items, 1, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      Item& it = items[static_cast<size_t>(item)];
      for (int j = 0; j < it.n_heads; ++j) it.inverse[j] = softmax_in_place(it.scores[j], it.visible, s);
    }
  });
  at::parallel_for(0, static_cast<int64_t>(dim_pieces.size()), 1, [&](int64_t begin, int64_t end) {
    for (int64_t piece = begin; piece < end; ++piece) {
      const auto [item, d0] = dim_pieces[static_cast<size_t>(piece)];
      const Item& it = items[static_cast<size_t>(item)];
      it.values_of(d0, std::min(dim, d0 + kDimsPerPiece), dim);
    }
  });
  return out;
}
