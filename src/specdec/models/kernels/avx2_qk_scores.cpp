// scores = q @ keys_t for attention, float32 out, on CPUs with AVX2 + FMA.
// qk_scores_at scores only the slots [first, first + count) of the buffer (an attention span, see
// avx2_attention_batch.cpp): each element is the same chain, so the same bits as in a whole-buffer call.
//
// q [H, R, D] and keys_t [H, D, S] (the cache's transposed keys) in bfloat16. Every output element is a
// float32 fused multiply-add chain over d in ascending order, starting from 0 (lanes run across S, 8
// slots per vector; slots past the last multiple of 8 take the same chain in scalar FMAs), and is not
// rounded to bfloat16. A row's scores therefore depend only on its own query and the keys, never on how
// many rows (tokens, query heads) share the call.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/Parallel.h>
#include <omp.h>
#include <immintrin.h>

#include <cmath>
#include <algorithm>
#include <cstdint>
#include <cstring>

#include "avx2_bf16.h"

namespace {

using specdec_bf16::bf16_to_float;
using specdec_bf16::has_avx512;
using specdec_bf16::load_bf16x16;
using specdec_bf16::load_bf16x8;
using specdec_bf16::load_bf16x16_split;

// R query rows (float32, stride dim) against V * 8 slots starting at keys (row stride slots).
template <int R, int V>
inline void score_block(const float* q, const uint16_t* keys, int64_t dim, int64_t slots, float* out,
                        int64_t ldo) {
  __m256 acc[R][V];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < V; ++v) acc[r][v] = _mm256_setzero_ps();
  for (int64_t d = 0; d < dim; ++d) {
    __m256 kv[V];
    for (int v = 0; v < V; ++v) kv[v] = load_bf16x8(keys + d * slots + 8 * v);
    for (int r = 0; r < R; ++r) {
      const __m256 qv = _mm256_broadcast_ss(q + r * dim + d);
      for (int v = 0; v < V; ++v) acc[r][v] = _mm256_fmadd_ps(qv, kv[v], acc[r][v]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < V; ++v) _mm256_storeu_ps(out + r * ldo + 8 * v, acc[r][v]);
}

// R query rows against 16 slots, each d's 16 keys widened by one load and two unpacks (load_bf16x16_split:
// half the shuffle work of load_bf16x8, which bound score_block on the EPYC); the same chains as score_block.
template <int R>
inline void score_pair(const float* q, const uint16_t* keys, int64_t dim, int64_t slots, float* out, int64_t ldo) {
  __m256 lo_acc[R], hi_acc[R];
  for (int r = 0; r < R; ++r) lo_acc[r] = hi_acc[r] = _mm256_setzero_ps();
  for (int64_t d = 0; d < dim; ++d) {
    __m256 lo, hi;
    load_bf16x16_split(keys + d * slots, lo, hi);
    for (int r = 0; r < R; ++r) {
      const __m256 qv = _mm256_broadcast_ss(q + r * dim + d);
      lo_acc[r] = _mm256_fmadd_ps(qv, lo, lo_acc[r]);
      hi_acc[r] = _mm256_fmadd_ps(qv, hi, hi_acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) {  // slots 0-3, 8-11 and 4-7, 12-15 back in order
    _mm256_storeu_ps(out + r * ldo, _mm256_permute2f128_ps(lo_acc[r], hi_acc[r], 0x20));
    _mm256_storeu_ps(out + r * ldo + 8, _mm256_permute2f128_ps(lo_acc[r], hi_acc[r], 0x31));
  }
}

template <int R>
inline void score_rows(const float* q, const uint16_t* keys, int64_t dim, int64_t slots, float* out,
                       int64_t ldo, int64_t s0, int64_t s1) {
  int64_t s = s0;
  for (; s + 16 <= s1; s += 16) score_pair<R>(q, keys + s, dim, slots, out + s, ldo);
  for (; s + 8 <= s1; s += 8) score_block<R, 1>(q, keys + s, dim, slots, out + s, ldo);
  for (; s < s1; ++s)
    for (int r = 0; r < R; ++r) {
      float acc = 0.0f;
      for (int64_t d = 0; d < dim; ++d) acc = std::fma(q[r * dim + d], bf16_to_float(keys[d * slots + s]), acc);
      out[r * ldo + s] = acc;
    }
}

// The same chains 16 slots per vector, on CPUs with AVX512F (every element the same FMA chain over d, so the
// same bits as the AVX2 loop: the choice of ISA changes only how many slots share an instruction). It halves
// the instructions of a decode step's scores, which run once per sequence and layer.

template <int R, int V>
SPECDEC_AVX512 inline void score_block16(const float* q, const uint16_t* keys, int64_t dim, int64_t slots, float* out,
                                         int64_t ldo, specdec_bf16::Prefetcher* pf) {
  __m512 acc[R][V];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < V; ++v) acc[r][v] = _mm512_setzero_ps();
  for (int64_t d = 0; d < dim; ++d) {
    __m512 kv[V];
    for (int v = 0; v < V; ++v) kv[v] = load_bf16x16(keys + d * slots + 16 * v);
    if (pf) pf->pump(1);
    for (int r = 0; r < R; ++r) {
      const __m512 qv = _mm512_set1_ps(q[r * dim + d]);
      for (int v = 0; v < V; ++v) acc[r][v] = _mm512_fmadd_ps(qv, kv[v], acc[r][v]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < V; ++v) _mm512_storeu_ps(out + r * ldo + 16 * v, acc[r][v]);
}

template <int R>
SPECDEC_AVX512 void score_rows16(const float* q, const uint16_t* keys, int64_t dim, int64_t slots, float* out,
                                 int64_t ldo, int64_t s0, int64_t s1, specdec_bf16::Prefetcher* pf) {
  int64_t s = s0;
  for (; s + 48 <= s1; s += 48) score_block16<R, 3>(q, keys + s, dim, slots, out + s, ldo, pf);
  for (; s + 16 <= s1; s += 16) score_block16<R, 1>(q, keys + s, dim, slots, out + s, ldo, pf);
  score_rows<R>(q, keys, dim, slots, out, ldo, s, s1);  // the tail: 8 slots a vector, then scalar
}

// Slots [s0, s1) of `rows` query rows (out's row stride ldo): 48 slots (AVX512) at a time against every block
// of 4 rows.
SPECDEC_AVX512 void score_span16(const float* q, int64_t rows, const uint16_t* keys, int64_t dim, int64_t stride,
                                 float* out, int64_t ldo, int64_t s0, int64_t s1, specdec_bf16::Prefetcher* pf) {
  for (int64_t s = s0; s < s1; s += 48) {
    const int64_t e = std::min(s1, s + 48);
    int64_t r = 0;
    // eight rows a block where there are (a decode step's query heads of two tokens, a tree's): each key
    // vector widened once for eight rows' FMAs instead of four (24 accumulators and 3 key vectors fit the 32
    // registers)
    for (; r + 8 <= rows; r += 8) score_rows16<8>(q + r * dim, keys, dim, stride, out + r * ldo, ldo, s, e, pf);
    for (; r + 4 <= rows; r += 4) score_rows16<4>(q + r * dim, keys, dim, stride, out + r * ldo, ldo, s, e, pf);
    switch (rows - r) {
      case 3: score_rows16<3>(q + r * dim, keys, dim, stride, out + r * ldo, ldo, s, e, pf); break;
      case 2: score_rows16<2>(q + r * dim, keys, dim, stride, out + r * ldo, ldo, s, e, pf); break;
      case 1: score_rows16<1>(q + r * dim, keys, dim, stride, out + r * ldo, ldo, s, e, pf); break;
      default: break;
    }
  }
}

#ifdef SPECDEC_AMX
}  // namespace
bool amx_score_span(const float* q, int64_t rows, const uint16_t* keys, int64_t dim, int64_t stride, float* out,
                    int64_t ldo, int64_t s0, int64_t s1);
namespace {
#endif

// Slots [s0, s1) of `rows` query rows (out's row stride ldo): 32 slots at a time (a cache line of each d's
// keys) against every block of 4 rows.
// The AMX build scores on tiles instead wherever the head dim allows (amx_qk_scores.cpp: other bits, the
// same on every path).
inline void score_span(const float* q, int64_t rows, const uint16_t* keys, int64_t dim, int64_t stride, float* out,
                       int64_t ldo, int64_t s0, int64_t s1, specdec_bf16::Prefetcher* pf = nullptr) {
#ifdef SPECDEC_AMX
  if (amx_score_span(q, rows, keys, dim, stride, out, ldo, s0, s1)) return;
#endif
  if (has_avx512()) return score_span16(q, rows, keys, dim, stride, out, ldo, s0, s1, pf);
  for (int64_t s = s0; s < s1; s += 32) {
    const int64_t e = std::min(s1, s + 32);
    int64_t r = 0;
    for (; r + 4 <= rows; r += 4) score_rows<4>(q + r * dim, keys, dim, stride, out + r * ldo, ldo, s, e);
    switch (rows - r) {
      case 3: score_rows<3>(q + r * dim, keys, dim, stride, out + r * ldo, ldo, s, e); break;
      case 2: score_rows<2>(q + r * dim, keys, dim, stride, out + r * ldo, ldo, s, e); break;
      case 1: score_rows<1>(q + r * dim, keys, dim, stride, out + r * ldo, ldo, s, e); break;
      default: break;
    }
  }
}

}  // namespace

// qk_scores_at's arithmetic on raw pointers, on the caller's thread: `rows` float32 query rows (stride dim)
// against keys [dim, stride] (already offset to the first slot), slots [s0, s1) into out's columns [s0, s1)
// (row stride ldo). Every element is its own chain, so threads may share one query row's slots.
void qk_scores_slots(const float* q, int64_t rows, const uint16_t* keys, int64_t dim, int64_t stride, float* out,
                     int64_t ldo, int64_t s0, int64_t s1, specdec_bf16::Prefetcher* pf) {
  score_span(q, rows, keys, dim, stride, out, ldo, s0, s1, pf);
}

at::Tensor qk_scores_at(at::Tensor q, at::Tensor keys_t, int64_t first, int64_t count) {
  TORCH_CHECK(q.scalar_type() == at::kBFloat16 && keys_t.scalar_type() == at::kBFloat16, "bfloat16 only");
  TORCH_CHECK(q.dim() == 3 && keys_t.dim() == 3 && q.size(0) == keys_t.size(0) && q.size(2) == keys_t.size(1),
              "q [H, R, D] and keys_t [H, D, S]");
  TORCH_CHECK(first >= 0 && count >= 0 && first + count <= keys_t.size(2), "slots outside the key buffer");
  keys_t = keys_t.contiguous();
  const int64_t heads = q.size(0), rows = q.size(1), dim = q.size(2), stride = keys_t.size(2), slots = count;
  auto out = at::empty({heads, rows, slots}, q.options().dtype(at::kFloat));
  if (heads * rows * slots == 0) return out;
  const auto qf = q.to(at::kFloat).contiguous();  // exact
  const float* qp = qf.data_ptr<float>();
  const auto* kp = reinterpret_cast<const uint16_t*>(keys_t.data_ptr<at::BFloat16>()) + first;
  float* outp = out.data_ptr<float>();
  // tasks: (head, span of 96 slots); within a span, 24 slots at a time against every block of 4 rows
  constexpr int64_t span = 96;
  const int64_t spans = (slots + span - 1) / span;
#pragma omp parallel for schedule(static) num_threads(at::get_num_threads())
  for (int64_t t = 0; t < heads * spans; ++t) {
    const int64_t h = t / spans, s0 = (t % spans) * span, s1 = std::min(slots, s0 + span);
    const float* qh = qp + h * rows * dim;
    const uint16_t* kh = kp + h * dim * stride;
    float* oh = outp + h * rows * slots;
    score_span(qh, rows, kh, dim, stride, oh, slots, s0, s1);
  }
  return out;
}

at::Tensor qk_scores(at::Tensor q, at::Tensor keys_t) {
  TORCH_CHECK(keys_t.dim() == 3, "q [H, R, D] and keys_t [H, D, S]");
  return qk_scores_at(q, keys_t, 0, keys_t.size(2));
}
