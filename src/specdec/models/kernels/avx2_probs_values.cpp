// out = probs @ values for attention, each query row reading the value slots in its own order (every build
// of the kernels uses this one, AVX2 + FMA). probs_values_at reads column s
// at slot first + s (or at the absolute slot order[.., s]): an attention span of the buffer, without a copy.
//
// Row r of head h reads values[h, order[r % tokens, s]] for s = 0, 1, ... without a copy (see
// models/attention_mask.py tree_slot_order). Every output element is a float32 fused multiply-add chain
// over s in ascending order, skipping zero probabilities (masked slots: adding 0 changes no sum), rounded
// to bfloat16 to nearest even, so a row's result depends only on its own probabilities and values, never
// on how many rows or which cache length share the call.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/Parallel.h>
#include <omp.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "avx2_bf16.h"

namespace {

using specdec_bf16::bf16_to_float;
using specdec_bf16::float_to_bf16;
using specdec_bf16::has_avx512;
using specdec_bf16::load_bf16x16;
using specdec_bf16::load_bf16x8;
using specdec_bf16::load_bf16x16_split;

// rounded as float_to_bf16 (avx2_bf16.h's to_bf16x8)
inline void store_bf16x8(uint16_t* p, __m256 v) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), specdec_bf16::to_bf16x8(v));
}

// G vectors (8 * G dims from d0) of one row's running sums (float32) carried on over slots [s0, s1): each
// element a fused multiply-add chain over ascending s, skipping zero probabilities. Pairs of vectors come
// from one 16-value load each, so `sums` holds them in load_bf16x16_split's order (store_group puts them
// back); an odd last vector is widened alone.
template <int G>
inline void sums_group(const uint16_t* prow, const int64_t* orow, const uint16_t* vbase, int64_t s0, int64_t s1,
                       int64_t dim, int64_t d0, float* sums) {
  constexpr int kPairs = G / 2;
  __m256 acc[G];
  for (int c = 0; c < G; ++c) acc[c] = _mm256_loadu_ps(sums + 8 * c);
  for (int64_t s = s0; s < s1; ++s) {
    const uint16_t pb = prow[s];
    if ((pb & 0x7FFF) == 0) continue;
    const __m256 p = _mm256_set1_ps(bf16_to_float(pb));
    const uint16_t* v = vbase + (orow ? orow[s] : s) * dim + d0;
    for (int c = 0; c < kPairs; ++c) {
      __m256 lo, hi;
      load_bf16x16_split(v + 16 * c, lo, hi);
      acc[2 * c] = _mm256_fmadd_ps(p, lo, acc[2 * c]);
      acc[2 * c + 1] = _mm256_fmadd_ps(p, hi, acc[2 * c + 1]);
    }
    if (G % 2) acc[G - 1] = _mm256_fmadd_ps(p, load_bf16x8(v + 16 * kPairs), acc[G - 1]);
  }
  for (int c = 0; c < G; ++c) _mm256_storeu_ps(sums + 8 * c, acc[c]);
}

// G vectors of sums_group's sums rounded to bfloat16, in dim order, at out.
template <int G>
inline void store_group(const float* sums, uint16_t* out) {
  for (int c = 0; c < G / 2; ++c) {
    const __m256 lo = _mm256_loadu_ps(sums + 16 * c), hi = _mm256_loadu_ps(sums + 16 * c + 8);
    store_bf16x8(out + 16 * c, _mm256_permute2f128_ps(lo, hi, 0x20));
    store_bf16x8(out + 16 * c + 8, _mm256_permute2f128_ps(lo, hi, 0x31));
  }
  if (G % 2) store_bf16x8(out + 16 * (G / 2), _mm256_loadu_ps(sums + 16 * (G / 2)));
}

// G vectors (8 * G dims starting at d0) of one output row.
template <int G>
inline void row_group(const uint16_t* prow, const int64_t* orow, const uint16_t* vhead, int64_t first,
                      int64_t slots, int64_t dim, int64_t d0, uint16_t* out) {
  float sums[8 * G] = {};
  sums_group<G>(prow, orow, orow ? vhead : vhead + first * dim, 0, slots, dim, d0, sums);
  store_group<G>(sums, out + d0);
}

// The same chains 16 dims per vector, on CPUs with AVX512F: every output element is still one FMA chain over
// s in ascending order, so the bits are the AVX2 loop's.

SPECDEC_AVX512 inline void store_bf16x16(uint16_t* p, __m512 v) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), specdec_bf16::to_bf16x16(v));
}

template <int G>
SPECDEC_AVX512 inline void row_group16(const uint16_t* prow, const int64_t* orow, const uint16_t* vhead, int64_t first,
                                       int64_t slots, int64_t dim, int64_t d0, uint16_t* out) {
  __m512 acc[G];
  for (int c = 0; c < G; ++c) acc[c] = _mm512_setzero_ps();
  for (int64_t s = 0; s < slots; ++s) {
    const uint16_t pb = prow[s];
    if ((pb & 0x7FFF) == 0) continue;
    const __m512 p = _mm512_set1_ps(bf16_to_float(pb));
    const uint16_t* v = vhead + (orow ? orow[s] : first + s) * dim + d0;
    for (int c = 0; c < G; ++c) acc[c] = _mm512_fmadd_ps(p, load_bf16x16(v + 16 * c), acc[c]);
  }
  for (int c = 0; c < G; ++c) store_bf16x16(out + d0 + 16 * c, acc[c]);
}

// The dims [0, 16 * (dim / 16)) of one output row; returns how many it did.
SPECDEC_AVX512 int64_t row_dims16(const uint16_t* prow, const int64_t* orow, const uint16_t* vhead, int64_t first,
                                  int64_t slots, int64_t dim, uint16_t* out) {
  const int64_t vectors = dim / 16;
  int64_t c = 0;
  for (; c + 8 <= vectors; c += 8) row_group16<8>(prow, orow, vhead, first, slots, dim, 16 * c, out);
  for (; c + 4 <= vectors; c += 4) row_group16<4>(prow, orow, vhead, first, slots, dim, 16 * c, out);
  for (; c < vectors; ++c) row_group16<1>(prow, orow, vhead, first, slots, dim, 16 * c, out);
  return 16 * vectors;
}

// Four output rows over the same value head and slots, 64 dims at a time: each value vector is loaded once for
// the four rows instead of once per row (a decode step's query heads that share a KV head read the same
// values; loading them per row made probs x values bound by L2 reads). Each element is still its own row's
// FMA chain over s in ascending order, skipping the slots where its own row's probability is zero.
// `orow` (or null: slot order): column s reads value slot orow[s] for all four rows (a verified tree's token
// read by each query head that shares its KV head), vbase then being the head's slot 0. The probabilities are
// widened to float32 once (exact), so a slot's four broadcasts are single loads, and a slot where all four
// are nonzero (nearly all of a span) runs its sixteen FMAs without a branch per row.
SPECDEC_AVX512 void rows4_dims16(const uint16_t* const* prows, const uint16_t* vbase, int64_t slots, int64_t dim,
                                 uint16_t* const* outs, int64_t dims, specdec_bf16::Prefetcher* pf,
                                 const int64_t* orow = nullptr) {
  thread_local std::vector<float> wide;
  wide.resize(static_cast<size_t>(4 * slots));
  for (int r = 0; r < 4; ++r)
    for (int64_t s = 0; s < slots; ++s) wide[r * slots + s] = bf16_to_float(prows[r][s]);
  const float* pw[4] = {wide.data(), wide.data() + slots, wide.data() + 2 * slots, wide.data() + 3 * slots};
  for (int64_t d0 = 0; d0 + 64 <= dims; d0 += 64) {
    __m512 acc[4][4];
    for (int r = 0; r < 4; ++r)
      for (int c = 0; c < 4; ++c) acc[r][c] = _mm512_setzero_ps();
    for (int64_t s = 0; s < slots; ++s) {
      const uint16_t z0 = prows[0][s] & 0x7FFF, z1 = prows[1][s] & 0x7FFF, z2 = prows[2][s] & 0x7FFF,
                     z3 = prows[3][s] & 0x7FFF;
      if (pf) pf->pump(2);
      if ((z0 | z1 | z2 | z3) == 0) continue;
      const uint16_t* v = vbase + (orow ? orow[s] : s) * dim + d0;
      __m512 vv[4];
      for (int c = 0; c < 4; ++c) vv[c] = load_bf16x16(v + 16 * c);
      if (z0 != 0 && z1 != 0 && z2 != 0 && z3 != 0) {
        for (int r = 0; r < 4; ++r) {
          const __m512 p = _mm512_set1_ps(pw[r][s]);
          for (int c = 0; c < 4; ++c) acc[r][c] = _mm512_fmadd_ps(p, vv[c], acc[r][c]);
        }
        continue;
      }
      const uint16_t zs[4] = {z0, z1, z2, z3};
      for (int r = 0; r < 4; ++r) {
        if (zs[r] == 0) continue;  // a zero probability adds nothing: skipped, as probs_values_row skips it
        const __m512 p = _mm512_set1_ps(pw[r][s]);
        for (int c = 0; c < 4; ++c) acc[r][c] = _mm512_fmadd_ps(p, vv[c], acc[r][c]);
      }
    }
    for (int r = 0; r < 4; ++r)
      for (int c = 0; c < 4; ++c) store_bf16x16(outs[r] + d0 + 16 * c, acc[r][c]);
  }
}

// The four rows' dims [0, dims) on AVX2 (whole vectors of 8; returns how many), kSlotBlock slots at a time
// for all four rows: a long span's values (2 MB a head at 4k slots) came from L3 once per row, and now once;
// the block's (128 KB at 256 dims) stay in L2 for the other rows (blocks of 64 or 1,024 slots gained less).
// Each element is still its own row's FMA chain over the slots in ascending order (the running sums stay
// float32 between blocks), rounded once: row_group's bits.
constexpr int64_t kSlotBlock = 256;

int64_t rows4_dims8(const uint16_t* const* prows, const uint16_t* vbase, int64_t slots, int64_t dim,
                    uint16_t* const* outs, int64_t dims, const int64_t* orow) {
  const int64_t done = dims / 8 * 8;
  if (done == 0) return 0;
  thread_local std::vector<float> sums;
  sums.assign(static_cast<size_t>(4 * done), 0.0f);
  for (int64_t s0 = 0; s0 < slots; s0 += kSlotBlock) {
    const int64_t s1 = std::min(slots, s0 + kSlotBlock);
    for (int r = 0; r < 4; ++r) {
      float* rs = sums.data() + r * done;
      int64_t d0 = 0;
      for (; d0 + 64 <= done; d0 += 64) sums_group<8>(prows[r], orow, vbase, s0, s1, dim, d0, rs + d0);
      for (; d0 < done; d0 += 8) sums_group<1>(prows[r], orow, vbase, s0, s1, dim, d0, rs + d0);
    }
  }
  for (int r = 0; r < 4; ++r) {
    int64_t d0 = 0;
    for (; d0 + 64 <= done; d0 += 64) store_group<8>(sums.data() + r * done + d0, outs[r] + d0);
    for (; d0 < done; d0 += 8) store_group<1>(sums.data() + r * done + d0, outs[r] + d0);
  }
  return done;
}

// Four rows' dims [0, dims) over one value head (vbase: the column 0's slot, or slot 0 with `orow`): on AVX512
// rows4_dims16's 64 at a time, else rows4_dims8's blocks of slots; returns the dims done.
int64_t rows4_dims(const uint16_t* const* prows, const uint16_t* vbase, int64_t slots, int64_t dim,
                   uint16_t* const* outs, int64_t dims, specdec_bf16::Prefetcher* pf, const int64_t* orow = nullptr) {
  if (has_avx512()) {
    const int64_t done = dims / 64 * 64;
    rows4_dims16(prows, vbase, slots, dim, outs, done, pf, orow);
    return done;
  }
  return rows4_dims8(prows, vbase, slots, dim, outs, dims, orow);
}

}  // namespace

// One output row: dim bfloat16 values from one row of probs over `slots` columns, column s read at value
// slot orow[s] (or first + s without an order). probs_values_at runs this for each of its rows.
void probs_values_row(const uint16_t* prow, const int64_t* orow, const uint16_t* vhead, int64_t first,
                      int64_t slots, int64_t dim, uint16_t* out) {
  const int64_t done = has_avx512() ? row_dims16(prow, orow, vhead, first, slots, dim, out) : 0;
  const int64_t vectors = dim / 8;
  int64_t c = done / 8;
  for (; c + 8 <= vectors; c += 8) row_group<8>(prow, orow, vhead, first, slots, dim, 8 * c, out);
  switch (vectors - c) {
    case 7: row_group<7>(prow, orow, vhead, first, slots, dim, 8 * c, out); break;
    case 6: row_group<6>(prow, orow, vhead, first, slots, dim, 8 * c, out); break;
    case 5: row_group<5>(prow, orow, vhead, first, slots, dim, 8 * c, out); break;
    case 4: row_group<4>(prow, orow, vhead, first, slots, dim, 8 * c, out); break;
    case 3: row_group<3>(prow, orow, vhead, first, slots, dim, 8 * c, out); break;
    case 2: row_group<2>(prow, orow, vhead, first, slots, dim, 8 * c, out); break;
    case 1: row_group<1>(prow, orow, vhead, first, slots, dim, 8 * c, out); break;
    default: break;
  }
  // dims past the last multiple of 8: the same chain, one scalar FMA at a time
  for (int64_t d = 8 * vectors; d < dim; ++d) {
    float acc = 0.0f;
    for (int64_t s = 0; s < slots; ++s) {
      const uint16_t pb = prow[s];
      if ((pb & 0x7FFF) == 0) continue;
      acc = std::fma(bf16_to_float(pb), bf16_to_float(vhead[(orow ? orow[s] : first + s) * dim + d]), acc);
    }
    out[d] = float_to_bf16(acc);
  }
}

// probs_values_rows4's dims [d0, d0 + dims) only (dims a multiple of 64): part of each of the four rows'
// elements, each the same chain, so threads may share one decode step's rows.
void probs_values_rows4_dims(const uint16_t* const* prows, const uint16_t* vhead, int64_t first, int64_t slots,
                             int64_t dim, uint16_t* const* outs, int64_t d0, int64_t dims) {
  uint16_t* const part[4] = {outs[0] + d0, outs[1] + d0, outs[2] + d0, outs[3] + d0};
  rows4_dims(prows, vhead + first * dim + d0, slots, dim, part, dims, nullptr);
}

// The four rows' dims past rows4_dims's, row by row on a scratch row.
static void rows4_rest(const uint16_t* const* prows, const int64_t* orow, const uint16_t* vhead, int64_t first,
                       int64_t slots, int64_t dim, uint16_t* const* outs, int64_t done) {
  if (done == dim) return;
  std::vector<uint16_t> full(static_cast<size_t>(dim));
  for (int r = 0; r < 4; ++r) {
    probs_values_row(prows[r], orow, vhead, first, slots, dim, full.data());
    std::memcpy(outs[r] + done, full.data() + done, static_cast<size_t>(dim - done) * 2);
  }
}

// Four rows' probs_values_row over the same value head, slots [first, first + slots) in slot order, together
// (rows4_dims): the same bits as one at a time.
void probs_values_rows4(const uint16_t* const* prows, const uint16_t* vhead, int64_t first, int64_t slots,
                        int64_t dim, uint16_t* const* outs, specdec_bf16::Prefetcher* pf) {
  const int64_t done = rows4_dims(prows, vhead + first * dim, slots, dim, outs, dim, pf);
  rows4_rest(prows, nullptr, vhead, first, slots, dim, outs, done);
}

// Four rows' probs_values_row over the same value head that read the value slots in one order `orow` (the
// query heads of one tree token that share a KV head), together: the same bits as one at a time.
void probs_values_rows4_ordered(const uint16_t* const* prows, const int64_t* orow, const uint16_t* vhead,
                                int64_t slots, int64_t dim, uint16_t* const* outs) {
  const int64_t done = rows4_dims(prows, vhead, slots, dim, outs, dim, nullptr, orow);
  rows4_rest(prows, orow, vhead, 0, slots, dim, outs, done);
}

#ifdef SPECDEC_AMX
bool amx_values_ready(int64_t dim);
bool amx_probs_values(const uint16_t* const* prows, const int64_t* const* orows, int64_t nr, const uint16_t* vhead,
                      int64_t first, int64_t slots, int64_t dim, uint16_t* const* outs, int64_t d0, int64_t dims);
#endif

at::Tensor probs_values_at(at::Tensor probs, at::Tensor values, at::Tensor order, int64_t tokens, int64_t first) {
  TORCH_CHECK(probs.scalar_type() == at::kBFloat16 && values.scalar_type() == at::kBFloat16, "bfloat16 only");
  TORCH_CHECK(probs.dim() == 3 && values.dim() == 3 && probs.size(0) == values.size(0) &&
              first >= 0 && first + probs.size(2) <= values.size(1), "probs [H, R, S] and values [H, >= S, D]");
  probs = probs.contiguous();
  values = values.contiguous();
  const int64_t heads = probs.size(0), rows = probs.size(1), slots = probs.size(2), dim = values.size(2);
  const int64_t capacity = values.size(1);
  const bool ordered = order.numel() > 0;
  if (ordered) {
    order = order.to(at::kLong).contiguous();
    TORCH_CHECK(order.dim() == 2 && order.size(0) == tokens && order.size(1) == slots && rows % tokens == 0,
                "order [tokens, S], rows a multiple of tokens");
  }
  auto out = at::empty({heads, rows, dim}, probs.options());
  const auto* pp = reinterpret_cast<const uint16_t*>(probs.data_ptr<at::BFloat16>());
  const auto* vp = reinterpret_cast<const uint16_t*>(values.data_ptr<at::BFloat16>());
  const int64_t* op = ordered ? order.data_ptr<int64_t>() : nullptr;
  auto* outp = reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>());
#ifdef SPECDEC_AMX
  if (amx_values_ready(dim)) {  // each head's rows at once on tiles (amx_probs_values.cpp), its dims in halves
    const int64_t parts = dim >= 64 ? 2 : 1, dims = (dim / 16 + parts - 1) / parts * 16;
#pragma omp parallel for schedule(static) num_threads(at::get_num_threads())
    for (int64_t t = 0; t < heads * parts; ++t) {
      const int64_t h = t / parts, d0 = (t % parts) * dims;
      std::vector<const uint16_t*> prows(rows);
      std::vector<const int64_t*> orows(rows);
      std::vector<uint16_t*> outs(rows);
      for (int64_t r = 0; r < rows; ++r) {
        prows[r] = pp + (h * rows + r) * slots;
        orows[r] = ordered ? op + (r % tokens) * slots : nullptr;
        outs[r] = outp + (h * rows + r) * dim;
      }
      if (d0 < dim)
        amx_probs_values(prows.data(), orows.data(), rows, vp + h * capacity * dim, first, slots, dim, outs.data(), d0,
                         std::min(dims, dim - d0));
    }
    return out;
  }
#endif
#pragma omp parallel for schedule(static) num_threads(at::get_num_threads())
  for (int64_t hr = 0; hr < heads * rows; ++hr) {
    const int64_t h = hr / rows, r = hr % rows;
    probs_values_row(pp + hr * slots, ordered ? op + (r % tokens) * slots : nullptr, vp + h * capacity * dim, first,
                     slots, dim, outp + hr * dim);
  }
  return out;
}

at::Tensor probs_values(at::Tensor probs, at::Tensor values, at::Tensor order, int64_t tokens) {
  TORCH_CHECK(probs.dim() == 3 && values.dim() == 3 && probs.size(2) == values.size(1),
              "probs [H, R, S] and values [H, S, D]");
  return probs_values_at(probs, values, order, tokens, 0);
}
