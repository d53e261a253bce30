// The columns of a bfloat16 LM head that may hold a row's first maximum, found from the head's int8 copy
// (int8_head_bound.h), on CPUs without AMX-INT8 (amx_screened_argmax.cpp does this with tiles there).
//
// Why: on an AVX2 CPU without AMX a greedy decode step reads the whole bfloat16 head, 335 MB for Gemma 3's
// 262,144 x 640, about as many bytes as all the layers together, and one row is bound by that read. The int8
// copy is half the bytes. The columns it cannot rule out (a handful a row on a model's own hidden states) are
// then scored by the caller with the head's own row kernel (models/column_screen.py), so the row's maximum is
// the same column with the same bits as the whole head gives.
//
// Integer dots: each row goes in as one int16 pass c (row_int16) and the copy's int8 quants are widened to
// int16 once per load, by shifts within each 16-bit slot (even bytes: << 8 then >> 8; odd bytes: >> 8);
// vpmaddwd multiplies 16-bit pairs into int32 lanes, exact in any order as the bound needs (row_int16 keeps
// 127 |c|_1 within int32). The widened weights stay in registers for up to kBlock rows at a time, so a
// further row costs two multiply-adds per 32 products and no weight read.
// Layout: tiles of 8 columns, per tile the k quads with the 8 columns side by side: [V / 8][K / 4][8][4] int8
// (K and V zero-padded), column c's 4 bytes in int32 lane c: its even bytes (k0, k2) meet the row's
// (c[k0], c[k2]) and its odd bytes (k1, k3) meet (c[k1], c[k3]). scale, c1, c2 padded to whole tiles with
// zeros. Threads split the tiles in contiguous ranges, so their candidates concatenate in column order.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <omp.h>

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <limits>
#include <vector>

#include "int8_head_bound.h"

// The AVX512-BF16 build (SPECDEC_SCREEN_VNNI) fuses each multiply-add pair into one VPDPWSSD (AVX512-VNNI on
// 256-bit lanes): the same exact int32 sums from half the instructions, where several rows make the products,
// not the read, the cost.
#ifdef SPECDEC_SCREEN_VNNI
#pragma GCC target("avx512f,avx512vl,avx512vnni")
#endif

namespace {

constexpr int64_t kCols = 8;  // columns per tile
constexpr int64_t kBlock = 8;  // rows whose products share one widened weight register (8 accumulators)

// A column that may be its row's maximum: its upper bound was at least the row's best lower bound so far.
struct Candidate {
  int32_t row;
  int32_t column;
  float upper;
};

inline float max8(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
  return _mm_cvtss_f32(m);
}

// acc[r] = the 8 columns' int32 dots with row c[r] over one tile's `quads` k quads (c[r]: [quads][2] int32,
// (c[k0], c[k2]) then (c[k1], c[k3]) as int16 pairs); R rows at once, so each weight load serves R rows.
template <int R>
inline void tile_dots(const int8_t* wt, int64_t quads, const int32_t* const* c, __m256i* acc, bool prefetch) {
  __m256i a[R];
  for (int r = 0; r < R; ++r) a[r] = _mm256_setzero_si256();
  for (int64_t g = 0; g < quads; ++g) {
    if (prefetch && (g & 1) == 0) _mm_prefetch(reinterpret_cast<const char*>(wt + g * 32 + 4096), _MM_HINT_T0);
    const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wt + g * 32));
    const __m256i even = _mm256_srai_epi16(_mm256_slli_epi16(w, 8), 8), odd = _mm256_srai_epi16(w, 8);
    for (int r = 0; r < R; ++r) {
#ifdef SPECDEC_SCREEN_VNNI
      a[r] = _mm256_dpwssd_epi32(_mm256_dpwssd_epi32(a[r], even, _mm256_set1_epi32(c[r][2 * g])), odd,
                                 _mm256_set1_epi32(c[r][2 * g + 1]));
#else
      a[r] = _mm256_add_epi32(a[r], _mm256_add_epi32(_mm256_madd_epi16(even, _mm256_set1_epi32(c[r][2 * g])),
                                                     _mm256_madd_epi16(odd, _mm256_set1_epi32(c[r][2 * g + 1]))));
#endif
    }
  }
  for (int r = 0; r < R; ++r) acc[r] = a[r];
}

inline void block_dots(int rows, const int8_t* wt, int64_t quads, const int32_t* const* c, __m256i* acc,
                       bool prefetch) {
  switch (rows) {
    case 1: return tile_dots<1>(wt, quads, c, acc, prefetch);
    case 2: return tile_dots<2>(wt, quads, c, acc, prefetch);
    case 3: return tile_dots<3>(wt, quads, c, acc, prefetch);
    case 4: return tile_dots<4>(wt, quads, c, acc, prefetch);
    case 5: return tile_dots<5>(wt, quads, c, acc, prefetch);
    case 6: return tile_dots<6>(wt, quads, c, acc, prefetch);
    case 7: return tile_dots<7>(wt, quads, c, acc, prefetch);
    default: return tile_dots<8>(wt, quads, c, acc, prefetch);
  }
}

}  // namespace

// w bfloat16 [V, K] -> (q int8 [V / 8 rounded up, K / 4 rounded up, 8, 4], scale, c1, c2 float32 [tiles * 8]),
// the factors of int8_head_bound.h; () when w has a non-finite value or one above kLargestWeight.
std::vector<at::Tensor> int8_head_tiles(at::Tensor w) {
  TORCH_CHECK(w.scalar_type() == at::kBFloat16 && w.dim() == 2 && w.size(0) > 0 && w.size(1) > 0,
              "a non-empty bfloat16 weight [V, K]");
  w = w.contiguous();
  const int64_t v_size = w.size(0), k_size = w.size(1);
  const int64_t tiles = (v_size + kCols - 1) / kCols, quads = (k_size + 3) / 4;
  auto q = at::zeros({tiles, quads, kCols, 4}, w.options().dtype(at::kChar));
  auto scale = at::zeros({tiles * kCols}, w.options().dtype(at::kFloat));
  auto c1 = at::zeros({tiles * kCols}, scale.options());
  auto c2 = at::zeros({tiles * kCols}, scale.options());
  const auto* wr = reinterpret_cast<const uint16_t*>(w.data_ptr());
  auto* qp = q.data_ptr<int8_t>();
  float *sp = scale.data_ptr<float>(), *c1p = c1.data_ptr<float>(), *c2p = c2.data_ptr<float>();
  std::atomic<bool> finite{true};
  at::parallel_for(0, v_size, 256, [&](int64_t j0, int64_t j1) {
    std::vector<int8_t> col(static_cast<size_t>(k_size));
    for (int64_t j = j0; j < j1; ++j) {
      if (!specdec_screen::column_copy(wr + j * k_size, k_size, col.data(), 1, sp[j], c1p[j], c2p[j])) {
        finite = false;
        continue;
      }
      // element k at tile j / 8, quad k / 4, lane j % 8, byte k % 4
      int8_t* base = qp + (j / kCols) * quads * kCols * 4 + (j % kCols) * 4;
      for (int64_t k = 0; k < k_size; ++k) base[(k / 4) * kCols * 4 + k % 4] = col[k];
    }
  });
  if (!finite) return {};
  return {q, scale, c1, c2};
}

// (columns int64 [n], offsets int64 [M + 1]): for each row m of bfloat16 x [M, K], the columns in [start, stop)
// of x @ w.T that its int8 copy (q, scale, c1, c2) = int8_head_tiles(w) cannot rule out as the row's first
// maximum, ascending, columns[offsets[m]:offsets[m + 1]]; a zero row gets `start` alone (every logit is
// zero). () where the screen does not apply: a row non-finite or near float32's range, or so many columns
// left that scoring them would cost more than the whole head.
std::vector<at::Tensor> screened_columns(at::Tensor x, at::Tensor q, at::Tensor scale, at::Tensor c1, at::Tensor c2,
                                         int64_t start, int64_t stop) {
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && x.dim() == 2 && x.size(1) > 0, "bfloat16 x [M, K]");
  const int64_t m_size = x.size(0), k_size = x.size(1), quads = (k_size + 3) / 4;
  TORCH_CHECK(q.scalar_type() == at::kChar && q.dim() == 4 && q.size(1) == quads && q.size(2) == kCols &&
                  q.size(3) == 4 && q.is_contiguous(), "q does not match x: int8_head_tiles(w)");
  const int64_t tiles = q.size(0);
  for (const auto& t : {scale, c1, c2})
    TORCH_CHECK(t.scalar_type() == at::kFloat && t.dim() == 1 && t.size(0) == tiles * kCols && t.is_contiguous(),
                "scale, c1 and c2 [tiles * 8] float32: int8_head_tiles(w)");
  TORCH_CHECK(0 <= start && start < stop && stop <= tiles * kCols && stop <= std::numeric_limits<int32_t>::max(),
              "columns [start, stop) within the head");
  auto offsets = at::zeros({m_size + 1}, x.options().dtype(at::kLong));
  if (m_size == 0) return {at::empty({0}, offsets.options()), offsets};
  x = x.contiguous();
  const auto* xr = reinterpret_cast<const uint16_t*>(x.data_ptr());

  // each row's int16 pass, zero-padded to whole quads and ordered (k0, k2, k1, k3) per quad; zero rows
  // (answered below) stay out of the products
  std::vector<int32_t> c_all(static_cast<size_t>(m_size * quads * 2), 0);
  std::vector<int16_t> row(static_cast<size_t>(quads * 4), 0);
  std::vector<specdec_screen::RowFactor> f(static_cast<size_t>(m_size));
  std::vector<int64_t> live;
  for (int64_t m = 0; m < m_size; ++m) {
    if (!specdec_screen::row_int16(xr + m * k_size, k_size, row.data(), f[m])) return {};
    auto* c = reinterpret_cast<int16_t*>(c_all.data() + m * quads * 2);
    for (int64_t g = 0; g < quads; ++g)
      for (int i = 0; i < 4; ++i) c[g * 4 + i] = row[g * 4 + (i % 2) * 2 + i / 2];
    if (f[m].l1 != 0.0f) live.push_back(m);
  }
  const int64_t n_live = static_cast<int64_t>(live.size());

  const auto* qp = q.data_ptr<int8_t>();
  const float *sp = scale.data_ptr<float>(), *c1p = c1.data_ptr<float>(), *c2p = c2.data_ptr<float>();
  const int64_t t_begin = start / kCols, t_end = (stop + kCols - 1) / kCols;
  const int threads = at::get_num_threads();
  std::vector<std::vector<float>> lower(threads, std::vector<float>(m_size, -std::numeric_limits<float>::infinity()));
  std::vector<std::vector<Candidate>> found(threads);
  // candidates a thread may keep before the screen gives up (flat rows keep most columns)
  const size_t most = static_cast<size_t>(stop - start) / 2 + 4096;
  std::atomic<bool> gave_up{false};
#pragma omp parallel num_threads(threads)
  {
    const int me = omp_get_thread_num(), team = omp_get_num_threads();
    float* best = lower[me].data();
    std::vector<Candidate>& mine = found[me];
    const int64_t per = (t_end - t_begin + team - 1) / team;
    const int64_t b0 = std::min(t_end, t_begin + me * per), b1 = std::min(t_end, b0 + per);
    const __m256 tiny = _mm256_set1_ps(specdec_screen::kTiny);
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const int32_t* c[kBlock];
    __m256i acc[kBlock];
    for (int64_t t = b0; t < b1 && !gave_up.load(std::memory_order_relaxed); ++t) {
      const int8_t* wt = qp + t * quads * kCols * 4;
      const int64_t col0 = t * kCols;
      // lanes of columns in [start, stop)
      const __m256i col = _mm256_add_epi32(_mm256_set1_epi32(static_cast<int32_t>(col0)), lane);
      const __m256 valid = _mm256_castsi256_ps(_mm256_and_si256(
          _mm256_cmpgt_epi32(col, _mm256_set1_epi32(static_cast<int32_t>(start) - 1)),
          _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int32_t>(stop)), col)));
      const __m256 sj = _mm256_loadu_ps(sp + col0), c1v = _mm256_loadu_ps(c1p + col0);
      const __m256 c2v = _mm256_loadu_ps(c2p + col0);
      for (int64_t i0 = 0; i0 < n_live; i0 += kBlock) {
        const int block = static_cast<int>(std::min<int64_t>(kBlock, n_live - i0));
        for (int r = 0; r < block; ++r) c[r] = c_all.data() + live[i0 + r] * quads * 2;
        block_dots(block, wt, quads, c, acc, i0 == 0);
        for (int r = 0; r < block; ++r) {
          const int64_t m = live[i0 + r];
          // the estimate and its bound, as amx_screened_argmax.cpp computes them (fused multiply-adds round
          // less than the bound allows for)
          const __m256 dot = _mm256_mul_ps(_mm256_set1_ps(f[m].alpha), _mm256_cvtepi32_ps(acc[r]));
          const __m256 bound = _mm256_fmadd_ps(_mm256_set1_ps(f[m].l1), c1v,
                                               _mm256_fmadd_ps(_mm256_set1_ps(f[m].err), c2v, tiny));
          const __m256 upper = _mm256_fmadd_ps(sj, dot, bound);
          const __m256 low_here = _mm256_blendv_ps(_mm256_set1_ps(-std::numeric_limits<float>::infinity()),
                                                   _mm256_fmsub_ps(sj, dot, bound), valid);
          best[m] = std::max(best[m], max8(low_here));
          int keep = _mm256_movemask_ps(
              _mm256_and_ps(valid, _mm256_cmp_ps(upper, _mm256_set1_ps(best[m]), _CMP_GE_OQ)));
          if (keep) {
            alignas(32) float up[kCols];
            _mm256_store_ps(up, upper);
            while (keep) {
              const int k = __builtin_ctz(keep);
              keep &= keep - 1;
              mine.push_back({static_cast<int32_t>(m), static_cast<int32_t>(col0 + k), up[k]});
            }
          }
        }
      }
      if (mine.size() > most) gave_up.store(true, std::memory_order_relaxed);
    }
  }
  if (gave_up) return {};

  // each row's best lower bound over the threads, then its surviving columns in column order
  std::vector<float> threshold(static_cast<size_t>(m_size), -std::numeric_limits<float>::infinity());
  for (int64_t m = 0; m < m_size; ++m)
    for (int t = 0; t < threads; ++t) threshold[m] = std::max(threshold[m], lower[t][m]);
  std::vector<std::vector<int64_t>> survivors(static_cast<size_t>(m_size));
  for (int64_t m = 0; m < m_size; ++m)
    if (f[m].l1 == 0.0f) survivors[m].push_back(start);
  for (int t = 0; t < threads; ++t)
    for (const Candidate& c : found[t])
      if (c.upper >= threshold[c.row]) survivors[c.row].push_back(c.column);
  size_t total = 0;
  for (const auto& cols : survivors) total += cols.size();
  // far more than a model's own hidden states leave (flat rows keep thousands): the whole head costs less
  if (total > static_cast<size_t>(stop - start) / 4 + static_cast<size_t>(m_size)) return {};
  auto columns = at::empty({static_cast<int64_t>(total)}, offsets.options());
  int64_t* cp = columns.data_ptr<int64_t>();
  int64_t* op = offsets.data_ptr<int64_t>();
  for (int64_t m = 0; m < m_size; ++m) {
    TORCH_CHECK(!survivors[m].empty(), "no column survived the screen (a bound is wrong)");
    std::copy(survivors[m].begin(), survivors[m].end(), cp + op[m]);
    op[m + 1] = op[m] + static_cast<int64_t>(survivors[m].size());
  }
  return {columns, offsets};
}
