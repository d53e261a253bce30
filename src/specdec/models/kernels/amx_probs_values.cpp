// Attention's probabilities x values on AMX-BF16 tiles (the AMX build only): where the head dim is a multiple
// of 32, every path that runs probs x values (a decode step, a verified chain or tree, a prefill chunk,
// decoder.attention's probs_values) runs it here, for all the rows of one value head that share a call.
//
// Why: the FMA loop (avx2_probs_values.cpp) spends one FMA per row, slot and 16 dims; at 1.6k slots the 64
// query rows of a 16-token verification step took about 70 us per layer and thread there, the larger part
// of the step's attention once the scores ran on tiles (amx_qk_scores.cpp). One TDPBF16PS is 16 rows x 16
// dims x 32 columns.
//
// Arithmetic: the span's columns (column s reads slot first + s, or the slot a tree row's order names) are
// taken in chunks of 32 from the span's first column, each chunk one TDPBF16PS into the row's float32
// accumulator, in ascending order from zero, then rounded to bfloat16 (to nearest even). A row's span
// starts where its own position puts it (avx2_attention_batch.cpp's attention_span), whatever shares the
// call, and the columns it may not see are zero probabilities times finite values (the cache is zeroed when
// sized; past the span, zeros), which change no sum. So a row's bits depend on its own probabilities and
// values only: in plain decoding, in a verified chain or tree, in a prefill chunk or a batch.
// amx_values_rows reads the cache's tile layout (values dim-major, kv_cache.py) as stored: attention_batch's
// path on the AMX build; amx_probs_values lays a plain-layout cache's values out so first.
// Trees: rows read the value slots in their own orders. The leading chunks, where every row's order names
// the same slots (the context), are computed for all rows at once; from the first chunk where two orders
// differ (the tree's own slots), each order's rows continue from their stored accumulators with their own
// values. A float32 accumulator stored and loaded again is unchanged, so these are the same bits.
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "amx_attention_tiles.h"

#pragma GCC push_options
#pragma GCC target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl")

namespace {

constexpr int64_t kChunk = 32;  // columns per tile multiply (its k)

// The value slot column `col` (absolute) of a row reads, or -1 outside the span [first, first + slots).
inline int64_t slot_of(const int64_t* order, int64_t first, int64_t slots, int64_t col) {
  if (col < first || col >= first + slots) return -1;
  return order ? order[col - first] : col;
}

// The first index where a and b differ, or n: eight at a time (a tree's rows share a context of thousands of
// columns, compared row against row in every layer).
inline int64_t first_difference(const int64_t* a, const int64_t* b, int64_t n) {
  int64_t s = 0;
  for (; s + 8 <= n; s += 8) {
    const __mmask8 differ = _mm512_cmpneq_epi64_mask(_mm512_loadu_si512(a + s), _mm512_loadu_si512(b + s));
    if (differ != 0) return s + __builtin_ctz(differ);
  }
  while (s < n && a[s] == b[s]) ++s;
  return s;
}

// How many of the span's leading chunks every row reads in the same slots (all of them without orders; a
// verified tree's rows share the context and differ from the chunk of its first own slot on).
inline int64_t shared_chunks(const int64_t* const* orows, int64_t nr, int64_t first, int64_t slots, int64_t chunks) {
  auto order_of = [&](int64_t r) { return orows ? orows[r] : nullptr; };
  int64_t shared = chunks;
  for (int64_t r = 1; r < nr && shared > 0; ++r) {
    if (order_of(r) == order_of(0)) continue;
    const int64_t n = std::min(slots, shared * kChunk);
    int64_t s = 0;
    if (order_of(r) != nullptr && order_of(0) != nullptr) {  // inside the span a column reads order[s]
      s = first_difference(order_of(r), order_of(0), n);
    } else {
      while (s < n && slot_of(order_of(r), first, slots, first + s) == slot_of(order_of(0), first, slots, first + s))
        ++s;
    }
    if (s < n) shared = std::min(shared, s / kChunk);
  }
  return shared;
}

// The distinct orders among the rows (null: slot order), in order of first appearance, each with the row tiles
// (of 16 rows) that hold rows reading it.
inline std::vector<std::pair<const int64_t*, std::vector<int64_t>>> order_groups(const int64_t* const* orows,
                                                                                 int64_t nr) {
  std::vector<std::pair<const int64_t*, std::vector<int64_t>>> groups;
  for (int64_t r = 0; r < nr; ++r) {
    const int64_t* order = orows ? orows[r] : nullptr;
    auto it = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == order; });
    if (it == groups.end()) it = groups.insert(groups.end(), {order, {}});
    if (it->second.empty() || it->second.back() != r / 16) it->second.push_back(r / 16);
  }
  return groups;
}

// float32 -> bfloat16, to nearest even (no NaN comes out of a sum of finite products)
inline void store_bf16x16(uint16_t* p, __m512 v) {
  const __m512i bits = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(bits, _mm512_set1_epi32(0x7FFF)), lsb), 16);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(rounded));
}

// A tree chunk's value columns gathered by permutation: where the slots that the chunk's columns in the span
// read lie within 64 of each other (a tree's own slots, a few apart), each dim's row of A is one two-register
// word permute of the values at those 64 slots, zeros for the columns past the span, instead of a strided load
// per value (what a 16-node tree's verification spent most of this function's time on). The same values in
// the same places: the same bits. False where it does not apply (the caller gathers one by one).
inline bool gather_by_permute(const int64_t* order, const uint16_t* vt, int64_t capacity, int64_t first, int64_t slots,
                              int64_t col0, int64_t d0, int64_t dims, uint16_t* into) {
  int64_t lo = INT64_MAX, hi = -1;
  uint32_t live = 0;
  for (int64_t i = 0; i < kChunk && col0 + i < first + slots; ++i) {
    const int64_t sl = order[col0 + i - first];
    lo = std::min(lo, sl);
    hi = std::max(hi, sl);
    live |= 1u << i;
  }
  if (live == 0 || lo < 0 || hi >= lo + 2 * kChunk || lo + 2 * kChunk > capacity) return false;
  alignas(64) uint16_t idx[kChunk] = {};
  for (int64_t i = 0; i < kChunk; ++i)
    if (live >> i & 1u) idx[i] = static_cast<uint16_t>(order[col0 + i - first] - lo);
  const __m512i iv = _mm512_load_si512(idx);
  for (int64_t d = 0; d < dims; ++d) {
    const uint16_t* src = vt + (d0 + d) * capacity + lo;
    const __m512i low = _mm512_loadu_si512(src), high = _mm512_loadu_si512(src + kChunk);
    _mm512_storeu_si512(into + d * kChunk, _mm512_maskz_permutex2var_epi16(live, low, iv, high));
  }
  return true;
}

}  // namespace

// `nr` rows of one value head: row r's probabilities prows[r] over columns [first, first + slots), column s
// reading value slot orows[r][s] (orows or orows[r] null: slot first + s), into outs[r]'s dims [d0, d0 + dims)
// (bfloat16), from the head's dim-major values (values_t [dim, capacity]: kv_cache.py's tile layout on the AMX
// build). 16 dims x 32 columns of it are the A operand, loaded as stored, and the rows' probabilities the B
// operand (each 16-row x 32-column block transposed into pairs once), so no value is repacked and a decode
// step's four rows cost a fraction of the FMA loop's time. A chunk that would read past `capacity`, and a
// tree's own chunks (each order's values gathered), read zero-padded copies. False (nothing written) where
// it does not apply: dim, d0 or dims not multiples of 32 / 16, or no AMX tile state from the OS.
bool amx_values_rows(const uint16_t* const* prows, const int64_t* const* orows, int64_t nr, const uint16_t* vt,
                     int64_t capacity, int64_t first, int64_t slots, int64_t dim, uint16_t* const* outs, int64_t d0,
                     int64_t dims) {
  if (dim % 32 != 0 || d0 % 16 != 0 || dims % 16 != 0 || !specdec_amx::amx_permitted()) return false;
  if (nr <= 0 || dims <= 0) return true;
  const int64_t chunks = (slots + kChunk - 1) / kChunk, lda = chunks * kChunk, row_tiles = (nr + 15) / 16;
  const int64_t blocks = dims / 16, rows_pad = row_tiles * 16;
  auto order_of = [&](int64_t r) { return orows ? orows[r] : nullptr; };
  const int64_t shared = shared_chunks(orows, nr, first, slots, chunks);
  // B: the probabilities, zero-padded to whole chunks and row tiles, then per (chunk, row tile) transposed
  // into pairs: word (p, r) = (P[r][32 j + 2 p], P[r][32 j + 2 p + 1])
  static thread_local std::vector<uint16_t> p;
  static thread_local std::vector<uint32_t> b;
  static thread_local std::vector<float> c;
  static thread_local std::vector<uint16_t> a;  // gathered or zero-padded value columns
  p.assign(static_cast<size_t>(rows_pad * lda), 0);
  for (int64_t r = 0; r < nr; ++r) std::memcpy(p.data() + r * lda, prows[r], slots * 2);
  b.resize(static_cast<size_t>(chunks * row_tiles * 256));
  for (int64_t j = 0; j < chunks; ++j)
    for (int64_t g = 0; g < row_tiles; ++g)
      specdec_amx::transpose16(reinterpret_cast<const uint32_t*>(p.data() + g * 16 * lda + j * kChunk), lda / 2,
                               b.data() + (j * row_tiles + g) * 256);
  // [dims][rows_pad]; the shared chunks' tiles store every element, so zeros only where there are none
  if (shared > 0)
    c.resize(static_cast<size_t>(dims * rows_pad));
  else
    c.assign(static_cast<size_t>(dims * rows_pad), 0.0f);
  specdec_amx::AttentionTiles tiles;  // C 0-3, A 4-5 (two dim blocks), B 6-7 (two row tiles)
  const int64_t c_stride = rows_pad * 4;
  // a chunk's value columns for dims [d0, d0 + dims) as A rows (ptr, stride in bytes): straight from values_t
  // where the order reads the slot order over the chunk and the chunk lies inside the buffer, else gathered
  // into `into` (zeros outside the span)
  auto columns = [&](const int64_t* order, int64_t j, uint16_t* into, int64_t& stride) -> const uint16_t* {
    const int64_t col0 = first + j * kChunk;
    bool in_order = col0 + kChunk <= capacity;
    for (int64_t i = 0; order != nullptr && in_order && i < kChunk; ++i)
      in_order = col0 + i >= first + slots || order[col0 + i - first] == col0 + i;
    if (in_order) {
      stride = capacity * 2;
      return vt + d0 * capacity + col0;
    }
    if (order != nullptr && gather_by_permute(order, vt, capacity, first, slots, col0, d0, dims, into)) {
      stride = kChunk * 2;
      return into;
    }
    std::fill(into, into + dims * kChunk, 0);
    for (int64_t i = 0; i < kChunk; ++i) {
      const int64_t sl = slot_of(order, first, slots, col0 + i);
      if (sl < 0) continue;
      for (int64_t d = 0; d < dims; ++d) into[d * kChunk + i] = vt[(d0 + d) * capacity + sl];
    }
    stride = kChunk * 2;
    return into;
  };
  // the shared chunks' A rows, gathered once where they must be
  a.resize(static_cast<size_t>((shared + 1) * dims * kChunk));
  static thread_local std::vector<const uint16_t*> cols;
  static thread_local std::vector<int64_t> strides;
  cols.resize(static_cast<size_t>(shared));
  strides.resize(static_cast<size_t>(shared));
  for (int64_t j = 0; j < shared; ++j) cols[j] = columns(order_of(0), j, a.data() + j * dims * kChunk, strides[j]);
  if (shared > 0)
    for (int64_t n = 0; n < blocks; n += 2)
      for (int64_t g = 0; g < row_tiles; g += 2) {
        const bool two_n = n + 1 < blocks, two_g = g + 1 < row_tiles;
        specdec_amx::zero_accumulators();
        for (int64_t j = 0; j < shared; ++j) {
          const int64_t stride = strides[j], row_words = stride / 2;  // bfloat16 per A row
          const uint32_t* bj = b.data() + j * row_tiles * 256 + g * 256;
          _tile_loadd(4, cols[j] + 16 * n * row_words, stride);
          _tile_loadd(6, bj, 64);
          _tile_dpbf16ps(0, 4, 6);
          if (two_n) {
            _tile_loadd(5, cols[j] + 16 * (n + 1) * row_words, stride);
            _tile_dpbf16ps(1, 5, 6);
          }
          if (two_g) {
            _tile_loadd(7, bj + 256, 64);
            _tile_dpbf16ps(2, 4, 7);
            if (two_n) _tile_dpbf16ps(3, 5, 7);
          }
        }
        float* c0 = c.data() + 16 * n * rows_pad + 16 * g;
        _tile_stored(0, c0, c_stride);
        if (two_n) _tile_stored(1, c0 + 16 * rows_pad, c_stride);
        if (two_g) {
          _tile_stored(2, c0 + 16, c_stride);
          if (two_n) _tile_stored(3, c0 + 16 * rows_pad + 16, c_stride);
        }
      }
  if (shared < chunks) {  // each distinct order's rows, chunk by chunk, from their stored sums
    alignas(64) float tmp[256];
    const auto groups = order_groups(orows, nr);
    for (int64_t j = shared; j < chunks; ++j)
      for (const auto& [order, row_tiles_of] : groups) {
        int64_t stride = 0;
        const uint16_t* chunk = columns(order, j, a.data() + shared * dims * kChunk, stride);
        const int64_t row_words = stride / 2;
        for (const int64_t g : row_tiles_of) {
          _tile_loadd(6, b.data() + (j * row_tiles + g) * 256, 64);
          for (int64_t n = 0; n < blocks; ++n) {
            float* cn = c.data() + 16 * n * rows_pad + 16 * g;
            _tile_loadd(0, cn, c_stride);
            _tile_loadd(4, chunk + 16 * n * row_words, stride);
            _tile_dpbf16ps(0, 4, 6);
            _tile_stored(0, tmp, 64);
            for (int64_t r = g * 16; r < std::min(nr, g * 16 + 16); ++r)
              if (order_of(r) == order)
                for (int64_t d = 0; d < 16; ++d) cn[d * rows_pad + (r - g * 16)] = tmp[d * 16 + (r - g * 16)];
          }
        }
      }
  }
  alignas(64) uint32_t rows16[256];  // a 16-dim x 16-row block of the sums transposed: row r's 16 dims
  for (int64_t g = 0; g < row_tiles; ++g)
    for (int64_t n = 0; n < blocks; ++n) {
      specdec_amx::transpose16(reinterpret_cast<const uint32_t*>(c.data() + 16 * n * rows_pad + 16 * g), rows_pad,
                               rows16);
      for (int64_t r = 16 * g; r < std::min(nr, 16 * g + 16); ++r)
        store_bf16x16(outs[r] + d0 + 16 * n, _mm512_castsi512_ps(_mm512_load_si512(rows16 + 16 * (r - 16 * g))));
    }
  return true;
}

// Whether the tiles run probs x values for a head dim: the choice depends on the model only, never on the call.
bool amx_values_ready(int64_t dim) { return dim % 32 == 0 && specdec_amx::amx_permitted(); }

// amx_values_rows for a cache in the plain layout (values [capacity, dim] of one head, `vhead` its slot 0):
// the slots the rows read are laid out dim-major in a copy first (decoder.attention's probs_values and
// attention_batch's tensor path; the AMX build's own cache needs none). The same chunks and products: the
// same bits.
bool amx_probs_values(const uint16_t* const* prows, const int64_t* const* orows, int64_t nr, const uint16_t* vhead,
                      int64_t first, int64_t slots, int64_t dim, uint16_t* const* outs, int64_t d0, int64_t dims) {
  if (!amx_values_ready(dim)) return false;
  int64_t lo = first, hi = first + slots;  // the slots read: the span, or wherever a row's order points
  for (int64_t r = 0; orows != nullptr && r < nr; ++r)
    for (int64_t s = 0; orows[r] != nullptr && s < slots; ++s) {
      lo = std::min(lo, orows[r][s]);
      hi = std::max(hi, orows[r][s] + 1);
    }
  static thread_local std::vector<uint16_t> vt;  // [dim][hi], rows [d0, d0 + dims) and slots [lo, hi) filled
  vt.resize(static_cast<size_t>(dim * hi));
  for (int64_t sl = lo; sl < hi; ++sl)
    for (int64_t d = d0; d < d0 + dims; ++d) vt[d * hi + sl] = vhead[sl * dim + d];
  return amx_values_rows(prows, orows, nr, vt.data(), hi, first, slots, dim, outs, d0, dims);
}

// attention_batch's threads hold one tile configuration across their sequences (amx_attention_tiles.h)
void amx_attention_tiles_enter() { specdec_amx::attention_tiles_enter(); }
void amx_attention_tiles_leave() { specdec_amx::attention_tiles_leave(); }


#pragma GCC pop_options
