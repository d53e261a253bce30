// argmax(x @ w.T) per row, the answer of rows_argmax_linear, from an int8 copy of the LM head plus an exact
// recheck of the few columns the copy cannot rule out.
//
// Why: greedy decoding's LM head reads all of its bfloat16 weights every step (Gemma 3's 262,144 x 640 are
// 335 MB, about 11.5 ms at this machine's ~29.5 GB/s: more than half of a batch-1 forward and a third of a
// 20-sequence step). One int8 per weight is half the bytes. The int8 logits are only estimates, but each has
// a proven bound on its distance from the bfloat16 logit, so a column whose upper bound is below the best
// lower bound of its row cannot be that row's argmax. The columns left (a handful a row) are recomputed with
// the head's own tile multiplies (amx_tiles.h's block_tiles), and the first maximum among them, in column
// order, is rows_argmax_linear's answer bit for bit: its first maximum is always among them.
//
// The estimate and its bound: int8_head_bound.h. Rows with non-finite values, or large enough to overflow,
// go to rows_argmax_linear.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <tuple>
#include <vector>

#include "amx_tiles.h"
#include "avx2_bf16.h"
#include "int8_head_bound.h"

at::Tensor rows_argmax_linear(at::Tensor x, at::Tensor w);

#pragma GCC push_options
#pragma GCC target("amx-tile,amx-int8,amx-bf16,avx512f,avx512bw,avx512vl,avx512dq")

namespace {

using namespace specdec_amx;

constexpr int64_t kQTileK = 64;  // int8 per tile row
// Blocks of 16 columns per chunk: each m tile sweeps a chunk in turn, so the weights come from memory once
// (for the first) and from L2 after (640 KB), and the x tiles of one m tile (20 KB) stay in L1.
constexpr int64_t kChunkBlocks = 64;
using specdec_screen::kTiny;

// A column that may be its row's argmax: its upper bound was at least the row's best lower bound so far.
struct Candidate {
  int32_t row;
  int32_t column;
  float upper;
};

// x rows [16 g, 16 g + 16) of one int8 pass as TDPBSSD's B operand for k tile t: 16 rows of k quads, each
// the 16 x rows' four int8: ((g * 2 + pass) * k_tiles + t) * 1024 + quad * 64 + row * 4 + i.
void pack_rows(const std::vector<int8_t>& a, int64_t m_size, int64_t kp, int64_t k_tiles, int64_t pass,
               std::vector<int8_t>& xb) {
  for (int64_t m = 0; m < m_size; ++m) {
    const int64_t g = m / kTileM, n = m % kTileM;
    for (int64_t k = 0; k < kp; ++k) {
      const int64_t t = k / kQTileK, quad = (k % kQTileK) / 4, i = k % 4;
      xb[((g * 2 + pass) * k_tiles + t) * 1024 + quad * 64 + n * 4 + i] = a[m * kp + k];
    }
  }
}

// One 16-column block against m tile g: C tile 0 takes the first pass (a), tile 1 the second (b).
inline void int8_block(const int8_t* q, int64_t kp, const int8_t* xb, int64_t k_tiles, int64_t g, const int8_t* ahead) {
  _tile_zero(0);
  _tile_zero(1);
  const int8_t* b = xb + g * 2 * k_tiles * 1024;
  for (int64_t t = 0; t < k_tiles; ++t) {
    if (ahead)
      for (int64_t r = 0; r < kTileN; ++r) _mm_prefetch(reinterpret_cast<const char*>(ahead + r * kp + t * kQTileK), _MM_HINT_T1);
    _tile_loadd(6, q + t * kQTileK, kp);
    _tile_loadd(7, b + t * 1024, 64);
    _tile_dpbssd(0, 6, 7);
    _tile_loadd(5, b + (k_tiles + t) * 1024, 64);
    _tile_dpbssd(1, 6, 5);
  }
}

// Per-row factors of the estimate and its bound, one vector per m tile.
struct RowFactors {
  std::vector<float> alpha, beta, l1, err;  // s_h, s_h / 254, |h|_1 and e_h (rounded up)
};

}  // namespace

// w bfloat16 [V, K] -> (q int8 [V rounded up to 16, K rounded up to 64] zero-padded, scale [V] = s_j,
// c1 [V] = d_j + (K + 32) roundings of max |w_j|, c2 [V] = s_j |q_j|_1), all float32 rounded up where a
// bound; empty when w has a non-finite value or one above kLargestWeight (no screening then).
std::vector<at::Tensor> amx_int8_head(at::Tensor w) {
  TORCH_CHECK(w.scalar_type() == at::kBFloat16 && w.dim() == 2 && w.size(0) > 0 && w.size(1) > 0,
              "a non-empty bfloat16 weight [V, K]");
  w = w.contiguous();
  const int64_t v_size = w.size(0), k_size = w.size(1);
  const int64_t kp = (k_size + kQTileK - 1) / kQTileK * kQTileK, vp = (v_size + kTileN - 1) / kTileN * kTileN;
  auto q = at::zeros({vp, kp}, w.options().dtype(at::kChar));
  auto scale = at::empty({v_size}, w.options().dtype(at::kFloat));
  auto c1 = at::empty({v_size}, scale.options());
  auto c2 = at::empty({v_size}, scale.options());
  const auto* wr = reinterpret_cast<const uint16_t*>(w.data_ptr());
  auto* qp = q.data_ptr<int8_t>();
  float *sp = scale.data_ptr<float>(), *c1p = c1.data_ptr<float>(), *c2p = c2.data_ptr<float>();
  bool finite = true;
  at::parallel_for(0, v_size, 256, [&](int64_t j0, int64_t j1) {
    for (int64_t j = j0; j < j1; ++j)
      if (!specdec_screen::column_copy(wr + j * k_size, k_size, qp + j * kp, 1, sp[j], c1p[j], c2p[j])) finite = false;
  });
  if (!finite) return {};
  return {q, scale, c1, c2};
}

// (argmax of each row of x @ w.T as rows_argmax_linear(x, w) gives it, the number of columns rechecked per
// row) for bfloat16 x [M, K] and w [V, K], with (q, scale, c1, c2) = amx_int8_head(w).
std::tuple<at::Tensor, at::Tensor> amx_screened_argmax(at::Tensor x, at::Tensor q, at::Tensor scale, at::Tensor c1,
                                                       at::Tensor c2, at::Tensor w) {
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && w.scalar_type() == at::kBFloat16, "bfloat16 x and w");
  TORCH_CHECK(x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1) && x.size(1) > 0, "x [M, K] and w [V, K]");
  const int64_t m_size = x.size(0), k_size = x.size(1), v_size = w.size(0);
  TORCH_CHECK(v_size > 0 && v_size <= std::numeric_limits<int32_t>::max(), "1 to 2^31 - 1 columns");
  const int64_t kp = (k_size + kQTileK - 1) / kQTileK * kQTileK, vp = (v_size + kTileN - 1) / kTileN * kTileN;
  TORCH_CHECK(q.scalar_type() == at::kChar && q.dim() == 2 && q.size(0) == vp && q.size(1) == kp && q.is_contiguous(),
              "q does not match w: amx_int8_head(w)");
  for (const auto& t : {scale, c1, c2})
    TORCH_CHECK(t.scalar_type() == at::kFloat && t.dim() == 1 && t.size(0) == v_size && t.is_contiguous(),
                "scale, c1 and c2 [V] float32: amx_int8_head(w)");
  TORCH_CHECK(amx_permitted(), "the kernel could not get AMX tile state from the OS");
  auto counts = at::zeros({m_size}, x.options().dtype(at::kLong));
  if (m_size == 0) return {at::empty({0}, counts.options()), counts};
  x = x.contiguous();
  w = w.contiguous();
  const auto* xr = reinterpret_cast<const uint16_t*>(x.data_ptr());
  const int64_t m_tiles = (m_size + kTileM - 1) / kTileM, k_tiles = kp / kQTileK;

  // the rows in two int8 passes, and their factors
  std::vector<int8_t> a(static_cast<size_t>(m_tiles * kTileM * kp), 0), b(a.size(), 0);
  RowFactors f{std::vector<float>(m_tiles * kTileM, 0.0f), std::vector<float>(m_tiles * kTileM, 0.0f),
               std::vector<float>(m_tiles * kTileM, 0.0f), std::vector<float>(m_tiles * kTileM, 0.0f)};
  for (int64_t m = 0; m < m_size; ++m) {
    specdec_screen::RowFactor r;
    // non-finite, or near enough to float32's range that a logit could overflow: the exact kernel decides
    if (!specdec_screen::row_passes(xr + m * k_size, k_size, a.data() + m * kp, b.data() + m * kp, r))
      return {rows_argmax_linear(x, w), counts.fill_(v_size)};
    f.alpha[m] = r.alpha;
    f.beta[m] = r.beta;
    f.l1[m] = r.l1;
    f.err[m] = r.err;
  }
  std::vector<int8_t> xb(static_cast<size_t>(m_tiles * 2 * k_tiles * 1024), 0);
  pack_rows(a, m_size, kp, k_tiles, 0, xb);
  pack_rows(b, m_size, kp, k_tiles, 1, xb);

  const auto* qp = q.data_ptr<int8_t>();
  const float *sp = scale.data_ptr<float>(), *c1p = c1.data_ptr<float>(), *c2p = c2.data_ptr<float>();
  const int64_t blocks = vp / kTileN;
  const int threads = at::get_num_threads();
  // per thread: each row's best lower bound so far, and its candidates in column order
  std::vector<std::vector<float>> lower(threads, std::vector<float>(m_tiles * kTileM, -std::numeric_limits<float>::infinity()));
  std::vector<std::vector<Candidate>> found(threads);
  constexpr int64_t kAhead = 4;  // blocks of 16 x K int8 prefetched ahead
  // Candidates a thread may keep before the screen gives up (flat rows keep most columns; 12 bytes each):
  // then the bfloat16 head decides, as for too many survivors below.
  const size_t most = static_cast<size_t>(v_size) / 2 + 4096;
  std::atomic<bool> gave_up{false};
#pragma omp parallel num_threads(threads)
  {
    ThreadTiles tiles;
    const int me = omp_get_thread_num(), team = omp_get_num_threads();
    float* best = lower[me].data();
    std::vector<Candidate>& mine = found[me];
    alignas(64) int32_t da[kTileN * kTileM], db[kTileN * kTileM];
    // the me-th contiguous range of blocks, so the threads' candidates merge in column order
    const int64_t per = (blocks + team - 1) / team;
    const int64_t b0 = std::min(blocks, me * per), b1 = std::min(blocks, b0 + per);
    for (int64_t c0 = b0; c0 < b1 && !gave_up.load(std::memory_order_relaxed); c0 += kChunkBlocks) {
      const int64_t c1 = std::min(b1, c0 + kChunkBlocks);
      for (int64_t g = 0; g < m_tiles; ++g) {
        const int64_t valid_rows = std::min<int64_t>(kTileM, m_size - g * kTileM);
        const __m512 alpha = _mm512_loadu_ps(f.alpha.data() + g * kTileM);
        const __m512 beta = _mm512_loadu_ps(f.beta.data() + g * kTileM);
        const __m512 l1 = _mm512_loadu_ps(f.l1.data() + g * kTileM);
        const __m512 err = _mm512_loadu_ps(f.err.data() + g * kTileM);
        // zero rows (answered below without a screen) would keep every column
        const __mmask16 lanes = first_lanes(valid_rows) & _mm512_cmp_ps_mask(l1, _mm512_setzero_ps(), _CMP_GT_OQ);
        __m512 low = _mm512_loadu_ps(best + g * kTileM);
        const __m512 tiny = _mm512_set1_ps(kTiny);
        for (int64_t blk = c0; blk < c1; ++blk) {
          const int8_t* qb = qp + blk * kTileN * kp;
          int8_block(qb, kp, xb.data(), k_tiles, g, g == 0 && blk + kAhead < b1 ? qb + kAhead * kTileN * kp : nullptr);
          _tile_stored(0, da, 64);
          _tile_stored(1, db, 64);
          const int64_t cols = std::min<int64_t>(kTileN, v_size - blk * kTileN);
          for (int64_t r = 0; r < cols; ++r) {  // column blk * 16 + r; lanes: the m tile's rows
            const int64_t col = blk * kTileN + r;
            // fused multiply-adds round less than the bound allows for
            const __m512 dot = _mm512_fmadd_ps(beta, _mm512_cvtepi32_ps(_mm512_load_si512(db + r * kTileM)),
                                               _mm512_mul_ps(alpha, _mm512_cvtepi32_ps(_mm512_load_si512(da + r * kTileM))));
            const __m512 sj = _mm512_set1_ps(sp[col]);
            const __m512 bound = _mm512_fmadd_ps(l1, _mm512_set1_ps(c1p[col]), _mm512_fmadd_ps(err, _mm512_set1_ps(c2p[col]), tiny));
            const __m512 upper = _mm512_fmadd_ps(sj, dot, bound);
            low = _mm512_mask_max_ps(low, lanes, low, _mm512_fmsub_ps(sj, dot, bound));
            __mmask16 keep = _mm512_mask_cmp_ps_mask(lanes, upper, low, _CMP_GE_OQ);
            if (keep) {
              alignas(64) float up[kTileM];
              _mm512_store_ps(up, upper);
              while (keep) {
                const int lane = __builtin_ctz(keep);
                keep &= keep - 1;
                mine.push_back({static_cast<int32_t>(g * kTileM + lane), static_cast<int32_t>(col), up[lane]});
              }
            }
          }
        }
        _mm512_storeu_ps(best + g * kTileM, low);
      }
      if (mine.size() > most) gave_up.store(true, std::memory_order_relaxed);
    }
  }
  if (gave_up) return {rows_argmax_linear(x, w), counts.fill_(v_size)};

  // the rows' best lower bounds over the threads; then each row's surviving columns, in column order
  std::vector<std::vector<int32_t>> survivors(static_cast<size_t>(m_size));
  std::vector<float> threshold(static_cast<size_t>(m_size), -std::numeric_limits<float>::infinity());
  for (int64_t m = 0; m < m_size; ++m)
    for (int t = 0; t < threads; ++t) threshold[m] = std::max(threshold[m], lower[t][m]);
  for (int t = 0; t < threads; ++t)
    for (const Candidate& c : found[t])
      if (c.upper >= threshold[c.row] && f.l1[c.row] > 0) survivors[c.row].push_back(c.column);

  // Far more survivors than a screen leaves on a model's own hidden states (about 10 a row on Gemma; flat
  // distributions keep thousands): gathering them would cost more than reading the whole bfloat16 head.
  size_t total = 0;
  for (const auto& cols : survivors) total += cols.size();
  if (total > static_cast<size_t>(v_size) / 4) return {rows_argmax_linear(x, w), counts.fill_(v_size)};

  // the exact logits of the survivors, with the head's own tile multiplies, and the first maximum
  auto result = at::empty({m_size}, counts.options());
  int64_t* out = result.data_ptr<int64_t>();
  int64_t* count = counts.data_ptr<int64_t>();
  const auto* wr = reinterpret_cast<const uint16_t*>(w.data_ptr());
  const int64_t bf_tiles = (k_size + kTileK - 1) / kTileK, lda = bf_tiles * kTileK;
  std::atomic<bool> bound_held{true};
#pragma omp parallel num_threads(threads)
  {
    ThreadTiles tiles;
    std::vector<uint16_t> gathered(static_cast<size_t>(kBlockN * lda));
    alignas(64) float logits[2][kTileN * kTileM];
#pragma omp for schedule(dynamic)
    for (int64_t m = 0; m < m_size; ++m) {
      if (f.l1[m] == 0) {  // a zero row: every logit is zero, and the first maximum is column 0
        out[m] = 0;
        continue;
      }
      const std::vector<int32_t>& cols = survivors[m];
      count[m] = static_cast<int64_t>(cols.size());
      if (cols.empty()) {  // cannot happen while the bound holds
        bound_held = false;
        continue;
      }
      const std::vector<uint32_t> xp = pack_x(xr + m * k_size, 1, k_size, bf_tiles, 1);
      float value = -std::numeric_limits<float>::infinity();
      int64_t index = cols[0];
      for (size_t c0 = 0; c0 < cols.size(); c0 += kBlockN) {
        const size_t n = std::min<size_t>(kBlockN, cols.size() - c0);
        if (n < static_cast<size_t>(kBlockN) || lda != k_size) std::fill(gathered.begin(), gathered.end(), 0);
        for (size_t i = 0; i < n; ++i)
          std::memcpy(gathered.data() + i * lda, wr + static_cast<int64_t>(cols[c0 + i]) * k_size, k_size * 2);
        block_tiles(gathered.data(), lda, xp.data(), bf_tiles, 1, 0, false, nullptr);
        store_tile(0, logits[0]);
        store_tile(2, logits[1]);
        for (size_t i = 0; i < n; ++i) {  // C^T: row i of the tile is gathered column i; lane 0 is x row m
          const float v = logits[i / kTileN][(i % kTileN) * kTileM];
          if (v > value || (std::isnan(v) && !std::isnan(value))) {
            value = v;
            index = cols[c0 + i];
          }
        }
      }
      out[m] = index;
    }
  }
  TORCH_CHECK(bound_held, "no column survived the screen (a bound is wrong)");
  return {result, counts};
}

#pragma GCC pop_options
