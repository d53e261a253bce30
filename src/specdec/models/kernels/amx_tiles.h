// What the AMX kernels share (amx_rows_linear.cpp, amx_rows_argmax_linear.cpp; amx_int8_quant_tiles.h takes
// its tile state): the tile shapes, the tile configuration, the OS request for the tile state, the x repacking
// into the B operand's pair layout, and the per-k-tile multiply of one 32-row weight block against every x row.
//
// The computation is transposed, C^T = w @ x^T: weight rows are the A operand, loaded straight from w, and
// an output element (m, n) starts at zero and takes one TDPBF16PS per 32-wide k tile, in k order, from its
// own row of A and column of B only. Every kernel built on block_tiles() therefore gives each logit the
// same bits, whatever M, the blocking or the threads.
#pragma once

#include <immintrin.h>
#include <omp.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#pragma GCC push_options
#pragma GCC target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl")

namespace specdec_amx {
constexpr int64_t kTileK = 32;  // bfloat16 per tile row (64 bytes)
constexpr int64_t kTileN = 16;  // tile rows: output features per A tile
constexpr int64_t kTileM = 16;  // x rows per B tile (its 16 float32 columns)
constexpr int64_t kBlockN = 2 * kTileN;  // two A tiles per block
// Software prefetch of the weights six blocks ahead, into L2: tile loads stall on DRAM misses, so without it
// the tile multiplies and the memory traffic do not overlap (32 rows took 1.5x longer on the LM head). Two
// 40 KB blocks ahead into L1 overflowed it: the LM head's argmax at 20 rows took 13.5 ms against 12.6 now
// (about 27 GB/s of the 29.5 measured), batch-1 linears 7.1 against 6.9.
constexpr int64_t kPrefetchBlocks = 6;

struct TileConfig {
  uint8_t palette_id = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// tiles 0-3: C (n block i, m tile j at 2 * i + j), 4-5: A (weights), 6-7: B (x); all 16 rows x 64 bytes
inline TileConfig bf16_tile_config() {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.rows[t] = 16;
    cfg.colsb[t] = 64;
  }
  return cfg;
}

// Linux gives a process the AMX tile state only on request (arch_prctl ARCH_REQ_XCOMP_PERM).
inline bool request_amx() {
  constexpr int kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
}

inline bool amx_permitted() {
  static const bool ok = request_amx();
  return ok;
}

// x [M, K] into the B operand's layout: for k tile t and m tile g, 16 rows (k pairs p) of 16 x-rows' pairs,
// ((t * m_tiles + g) * 16 + p) * 16 + m  <-  (x[16 g + m][32 t + 2 p], x[16 g + m][32 t + 2 p + 1]) as one
// 32-bit word, zero where out of range.
inline std::vector<uint32_t> pack_x(const uint16_t* x, int64_t m_size, int64_t k_size, int64_t k_tiles, int64_t m_tiles) {
  std::vector<uint32_t> packed(static_cast<size_t>(k_tiles * m_tiles * kTileM * kTileK / 2), 0);
  const int64_t pairs = k_size / 2;
#pragma omp parallel for schedule(static) num_threads(m_size >= 64 ? at::get_num_threads() : 1)
  for (int64_t m = 0; m < m_size; ++m) {
    const uint16_t* row = x + m * k_size;
    uint32_t* out = packed.data() + (m / kTileM) * kTileM * 16 + m % kTileM;
    for (int64_t q = 0; q < pairs; ++q) {
      uint32_t v;
      std::memcpy(&v, row + 2 * q, 4);
      out[((q / 16) * m_tiles * 16 + q % 16) * 16] = v;
    }
    if (k_size % 2) out[((pairs / 16) * m_tiles * 16 + pairs % 16) * 16] = row[k_size - 1];
  }
  return packed;
}


// C^T tiles of one block of 32 weight rows against x rows [16 g, 16 g + 32): tile 2 i + j holds weight rows
// 16 i.. and x rows 16 (g + j)..; `two` is whether the second x tile exists. Prefetches `ahead` (a later
// block's weights) on the first pair only.
inline void block_tiles(const uint16_t* w, int64_t lda, const uint32_t* xp, int64_t k_tiles, int64_t m_tiles,
                        int64_t g, bool two, const uint16_t* ahead) {
  const int64_t stride = lda * 2;
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (int64_t t = 0; t < k_tiles; ++t) {
    const uint32_t* b = xp + (t * m_tiles + g) * kTileM * 16;
    if (ahead && g == 0)  // a later block's weights, one 64-byte line per row and k tile (no arithmetic)
      for (int64_t r = 0; r < kBlockN; ++r) _mm_prefetch(reinterpret_cast<const char*>(ahead + r * lda + t * kTileK), _MM_HINT_T1);
    _tile_loadd(4, w + t * kTileK, stride);
    _tile_loadd(5, w + kTileN * lda + t * kTileK, stride);
    _tile_loadd(6, b, 64);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(2, 5, 6);
    if (two) {
      _tile_loadd(7, b + kTileM * 16, 64);
      _tile_dpbf16ps(1, 4, 7);
      _tile_dpbf16ps(3, 5, 7);
    }
  }
}

// Tile c (0-3) to `out` [16 x 16 float32]; the tile number must be an immediate.
inline void store_tile(int c, float* out) {
  switch (c) {
    case 0: _tile_stored(0, out, 64); break;
    case 1: _tile_stored(1, out, 64); break;
    case 2: _tile_stored(2, out, 64); break;
    default: _tile_stored(3, out, 64); break;
  }
}

// Sets this thread's tile configuration on construction and puts back what it had on destruction. The OpenMP
// threads are shared with anything else in the process that uses them (torch, llama.cpp's ggml built with
// OpenMP), and ggml configures its tiles once per thread: releasing the tiles, or leaving ours configured,
// made its next tile multiply fault or compute with our shapes.
class ThreadTiles {
 public:
  ThreadTiles() : ThreadTiles(bf16_tile_config()) {}
  explicit ThreadTiles(const TileConfig& cfg) {
    _tile_storeconfig(&before_);
    _tile_loadconfig(&cfg);
  }
  ~ThreadTiles() {
    if (before_.palette_id != 0)
      _tile_loadconfig(&before_);
    else
      _tile_release();
  }

 private:
  TileConfig before_;
};

// 16 float32 to bfloat16 as torch's vectorized conversion rounds them (round to nearest even on the bits;
// NaN to 0xFFFF), so a kernel's bfloat16 output equals its float32 output passed through .to(torch.bfloat16).
inline __m256i to_bf16(__m512 v) {
  const __m512i bits = _mm512_castps_si512(v);
  __m512i t = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  t = _mm512_add_epi32(_mm512_add_epi32(t, _mm512_set1_epi32(0x7fff)), bits);
  t = _mm512_srli_epi32(t, 16);
  t = _mm512_mask_blend_epi32(_mm512_cmp_ps_mask(v, v, _CMP_ORD_Q), _mm512_set1_epi32(0xffff), t);
  return _mm512_cvtusepi32_epi16(t);
}

// The first n (at most 16) of 16 lanes.
inline __mmask16 first_lanes(int64_t n) {
  return n >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << n) - 1);
}

// 16 float32 outputs to `to` (the lanes in `mask`), as float32 or rounded to bfloat16 (to_bf16).
template <typename Out>
inline void store_outputs(Out* to, __mmask16 mask, __m512 v) {
  if constexpr (sizeof(Out) == 4)
    _mm512_mask_storeu_ps(to, mask, v);
  else
    _mm256_mask_storeu_epi16(to, mask, to_bf16(v));
}

// A 16 x 16 block of 32-bit words (rows `stride` words apart) transposed into dst (16 rows of 16 words).
inline void transpose16(const uint32_t* src, int64_t stride, uint32_t* dst) {
  __m512i r[16], t[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_si512(src + i * stride);
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {
    r[4 * i + 0] = _mm512_unpacklo_epi64(t[4 * i + 0], t[4 * i + 2]);
    r[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i + 0], t[4 * i + 2]);
    r[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
    r[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
  }
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 4; ++j) {
      t[8 * i + j] = _mm512_shuffle_i32x4(r[8 * i + j], r[8 * i + j + 4], 0x88);
      t[8 * i + j + 4] = _mm512_shuffle_i32x4(r[8 * i + j], r[8 * i + j + 4], 0xdd);
    }
  for (int j = 0; j < 8; ++j) {
    r[j] = _mm512_shuffle_i32x4(t[j], t[j + 8], 0x88);
    r[j + 8] = _mm512_shuffle_i32x4(t[j], t[j + 8], 0xdd);
  }
  for (int i = 0; i < 16; ++i) _mm512_storeu_si512(dst + i * 16, r[i]);
}

// 32 weight rows (w, row stride lda elements, k_tiles * 32 readable columns) into the B operand's layout:
// packed[(t * 2 + j) * 256 + p * 16 + c] = the pair p of k tile t of weight row 16 j + c.
inline void pack_w_block(const uint16_t* w, int64_t lda, int64_t k_tiles, uint32_t* packed) {
  for (int64_t t = 0; t < k_tiles; ++t)
    for (int j = 0; j < 2; ++j)
      transpose16(reinterpret_cast<const uint32_t*>(w + 16 * j * lda + kTileK * t), lda / 2, packed + (t * 2 + j) * 256);
}

// Rows [m0, m0 + 16) of C [.., 16 columns] from tile c: straight into y when whole and float32, else through
// `out` (bfloat16 rounding, or a tail of rows or columns).
template <typename Out>
inline void store_tile_rows(int c, float* out, Out* y, int64_t n_size, int64_t m0, int64_t rows, int64_t n0,
                            int64_t cols) {
  if constexpr (sizeof(Out) == 4) {
    if (rows == kTileM && cols == kTileN) {
      float* to = y + m0 * n_size + n0;
      switch (c) {
        case 0: _tile_stored(0, to, n_size * 4); break;
        case 1: _tile_stored(1, to, n_size * 4); break;
        case 2: _tile_stored(2, to, n_size * 4); break;
        default: _tile_stored(3, to, n_size * 4); break;
      }
      return;
    }
  }
  store_tile(c, out);
  const __mmask16 mask = first_lanes(cols);
  for (int64_t r = 0; r < rows; ++r) store_outputs(y + (m0 + r) * n_size + n0, mask, _mm512_load_ps(out + r * kTileN));
}

// Rows [m0, m0 + rows) of C's 32 columns [n0, n0 + 32) from tiles 2 i and 2 i + 1, rounded to bfloat16: each
// row's 64 bytes (one cache line) in one store. Storing the two tiles one after the other wrote each line in
// two halves, and with a wide output (gate_up's 8 KB rows map 16 rows to one L1 set) the first half was
// often evicted before the second came: a 2048-row gate_up ran at half the speed of the narrower linears.
inline void store_tile_pair_bf16(int i, float* out, uint16_t* y, int64_t n_size, int64_t m0, int64_t rows, int64_t n0) {
  store_tile(2 * i, out);
  store_tile(2 * i + 1, out + kTileM * kTileN);
  for (int64_t r = 0; r < rows; ++r) {
    const __m512i lo = _mm512_castsi256_si512(to_bf16(_mm512_load_ps(out + r * kTileN)));
    const __m512i both = _mm512_inserti64x4(lo, to_bf16(_mm512_load_ps(out + kTileM * kTileN + r * kTileN)), 1);
    _mm512_storeu_si512(y + (m0 + r) * n_size + n0, both);
  }
}

// The untransposed form, C = x @ w^T, for one block of 32 weight rows in pack_w_block's layout (`packed`)
// against every row of x (row stride lda elements, k_tiles * 32 readable columns; the rows from `full` on
// are read from `tail`, a zero-padded copy of 32 rows): writes columns [n0, n0 + n_valid) of y. A group of
// at most 16 rows multiplies one x tile. `ahead`: a later packed block, prefetched on the first group.
template <typename Out>
inline void packed_block_rows(const uint16_t* x, int64_t lda, int64_t m_size, int64_t full, const uint16_t* tail,
                              const uint32_t* packed, int64_t k_tiles, Out* y, int64_t n_size, int64_t n0,
                              int64_t n_valid, const uint32_t* ahead) {
  alignas(64) float out[2 * kTileM * kTileN];
  for (int64_t m = 0; m < m_size; m += 2 * kTileM) {
    const uint16_t* a = m >= full ? tail : x + m * lda;
    const bool two = m_size - m > kTileM;
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int64_t t = 0; t < k_tiles; ++t) {
      if (ahead && m == 0)  // the later block's 2 KB of this k tile, one line at a time
        for (int64_t l = 0; l < 32; ++l) _mm_prefetch(reinterpret_cast<const char*>(ahead + t * 512 + l * 16), _MM_HINT_T1);
      _tile_loadd(4, a + kTileK * t, lda * 2);
      _tile_loadd(6, packed + (t * 2) * 256, 64);
      _tile_loadd(7, packed + (t * 2 + 1) * 256, 64);
      _tile_dpbf16ps(0, 4, 6);
      _tile_dpbf16ps(1, 4, 7);
      if (two) {
        _tile_loadd(5, a + kTileM * lda + kTileK * t, lda * 2);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
      }
    }
    for (int i = 0; i < (two ? 2 : 1); ++i) {  // x tile i, weight half j
      const int64_t rows = std::min<int64_t>(kTileM, m_size - m - i * kTileM);
      if constexpr (sizeof(Out) == 2) {
        if (n_valid == kBlockN && rows > 0) {
          store_tile_pair_bf16(i, out, y, n_size, m + i * kTileM, rows, n0);
          continue;
        }
      }
      for (int j = 0; j < 2; ++j) {
        const int64_t cols = std::min<int64_t>(kTileN, n_valid - j * kTileN);
        if (rows > 0 && cols > 0) store_tile_rows(2 * i + j, out, y, n_size, m + i * kTileM, rows, n0 + j * kTileN, cols);
      }
    }
  }
}

// A zero-padded copy of rows [n0, n0 + n_valid) of w [.., k_size], each lda = k_tiles * 32 wide, for a block
// that would otherwise be read past w's rows or columns.
inline void pad_block(const uint16_t* w, int64_t k_size, int64_t n0, int64_t n_valid, int64_t lda,
                      std::vector<uint16_t>& pad) {
  pad.assign(static_cast<size_t>(kBlockN * lda), 0);
  for (int64_t r = 0; r < n_valid; ++r)
    std::memcpy(pad.data() + r * lda, w + (n0 + r) * k_size, static_cast<size_t>(k_size) * 2);
}

}  // namespace specdec_amx

#pragma GCC pop_options
