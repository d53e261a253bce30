// The quantized linear for several rows on CPUs with AMX-INT8: avx512_vnni_quant_linear.cpp built with
// SPECDEC_AMX_INT8 runs the whole 16-row tiles of its larger calls here (amx_rows). The same bits as its VNNI loop.
//
// Why: with VNNI each (row, block of 32 k, 16 columns) costs 8 vpdpbusd before its float chain, so a prefill
// of a few hundred rows ran at half the speed of bf16's AMX kernels, and 16 verification rows cost twice
// one row. One TDPBSSD (signed x signed bytes) or TDPBSUD (signed x unsigned, for 4-bit quants) computes a
// block's int32 sums for 16 rows x 16 columns; what remains per row is its float chain.
//
// Arithmetic: the integer sum per (row, column, block) is exact whichever instruction computes it, so it is
// the VNNI loop's integer; the float chain is the same ops in the same order (s * dx, float(isum) times
// that, added to y; u4 subtracts m * sx first; no FMA). Which path, row tile or thread a row falls in
// changes no operation on it.
//   - A tile: 16 rows' quantized activations of one block (32 bytes each, rows side by side in the block-major
//     layout). B tile: the block's 8 groups of 4 k x 16 columns: s8 is stored so already; u4 and
//     s5 are unpacked per column tile into a scratch buffer once, then feed every row tile.
//   - s5's u = q + 16 is unpacked to q itself (signed), so its sums need no correction.
//   - Q6_K's sub-scales (one per 16 k) need the block's two halves apart: two 16-k products into two C tiles,
//     then lo * sub_lo + hi * sub_hi in int32, as the VNNI loop.
// Loop: threads split the column tiles; per tile, the row tiles one after the other, each keeping its 16
// rows' running sums in 16 registers across the blocks.
#pragma once

#include "amx_tiles.h"
#include "avx512_quant_blocks.h"
#include "quant_linear_args.h"

#pragma GCC push_options
#pragma GCC target("amx-tile,amx-int8,avx512f,avx512bw,avx512vl")

namespace specdec_quant512 {

// Whether a call of m_size rows on weights of `kind` runs its whole 16-row tiles here (the rows past the last
// whole tile run the VNNI loop). A row tile's tile work (loads, the product, storing 1 KB of sums) costs about
// what the VNNI loop spends on 12 rows, so fewer rows stay there; u4's float chain is 6 ops a row and block
// against s8's 4, so it breaks even only at about 32 rows. Measured on a 2-core Xeon, ms, AMX / VNNI build
// (docs/quantization-runs.md, two runs, 5-15% spread): the 18 layers' int8 linears 8.2 / 9.6 at 16 rows,
// 13.3 / 15.8 at 32, 25.0 / 32.2 at 64; int4 16.0 / 15.4 at 32 (15.0 / 16.1 in the other run), 30.1 / 33.1
// at 64; an int8 LM head (262144 x 640) 9.0 / 11.5 at 16 rows and 41.9 / 51.4 at 64.
inline bool amx_rows(int64_t m_size, int64_t kind) {
  return m_size >= (kind == 1 ? 32 : 16) && specdec_amx::amx_permitted();
}

// Without sub-scales: tiles 0-3 are C (16 rows x 16 int32 columns, four blocks in flight), 4-5 A (16 rows x
// one block's 32 k), 6-7 B (one block's 8 groups of 4 k x 16 columns, 4 bytes each). With Q6_K's sub-scales:
// 0 and 7 are C, 3-4 A's first and second 16 k, 5-6 B's groups 0-3 and 4-7.
inline specdec_amx::TileConfig int8_tile_config(bool sub) {
  specdec_amx::TileConfig cfg;
  const int plain_rows[8] = {16, 16, 16, 16, 16, 16, 8, 8}, plain_colsb[8] = {64, 64, 64, 64, 32, 32, 64, 64};
  const int sub_rows[8] = {16, 0, 0, 16, 16, 4, 4, 16}, sub_colsb[8] = {64, 0, 0, 16, 16, 64, 64, 64};
  for (int t = 0; t < 8; ++t) {
    cfg.rows[t] = static_cast<uint8_t>(sub ? sub_rows[t] : plain_rows[t]);
    cfg.colsb[t] = static_cast<uint16_t>(sub ? sub_colsb[t] : plain_colsb[t]);
  }
  return cfg;
}

// Bytes of weights prefetched ahead of the block being read, as the VNNI loop does: tile loads stall on cache
// misses rather than overlap them (amx_tiles.h), and a step's layers stream from L3 or memory.
constexpr int64_t kAhead = 2048;

// One tile's weights, every block, in B's layout ([blocks][8 groups][16 columns][4] bytes): s8 is stored so;
// u4 (unsigned) and s5 (as signed q = u - 16) are unpacked into `scratch`.
inline const uint8_t* b_operand(const uint8_t* w, int64_t kind, int64_t blocks, uint8_t* scratch) {
  if (kind == 0) return w;
  const __m512i sixteen = _mm512_set1_epi8(16);
  for (int64_t b = 0; b < blocks; ++b) {
    __m512i wv[8];
    const uint8_t* wb = w + b * block_bytes(kind);
    for (int64_t l = 0; l < block_bytes(kind); l += 64)
      _mm_prefetch(reinterpret_cast<const char*>(wb + kAhead + l), _MM_HINT_T0);
    if (kind == 1) {
      unpack_nibbles(wb, wv);
    } else {
      unpack_s5(wb, wv);
      for (int g = 0; g < 8; ++g) wv[g] = _mm512_sub_epi8(wv[g], sixteen);
    }
    for (int g = 0; g < 8; ++g) _mm512_storeu_si512(scratch + b * 512 + g * 64, wv[g]);
  }
  return scratch;
}

// The int32 sums of one block into C tile `c` from A tile `a` and B tile `bt` (immediates: a macro);
// TDPBSUD for u4's unsigned quants.
#define SPECDEC_BLOCK_SUMS(c, a, bt, xa, wb, u4) \
  do {                                           \
    _tile_zero(c);                               \
    _tile_loadd(a, xa, kBlock);                  \
    _tile_loadd(bt, wb, 64);                     \
    if (u4)                                      \
      _tile_dpbsud(c, a, bt);                    \
    else                                         \
      _tile_dpbssd(c, a, bt);                    \
  } while (0)

// One block's float chain for 16 rows: acc[r] = acc[r] + float(isum) * (s * dx[r]), u4 subtracting m * sx[r]
// from the product first (isum: [16 rows][16 columns] int32). Always inlined, with acc never escaping, so the
// 16 running sums stay in registers (as a lambda's capture they lived on the stack: a load and a store more
// per row and block).
template <bool kU4, typename S>
__attribute__((always_inline)) inline void chain_block(__m512 (&acc)[16], const int32_t* isum, const S* s,
                                                       const S* mins, const float* dx, const float* sx) {
  const __m512 sv = load_scales(s);
  if constexpr (kU4) {
    const __m512 mv = load_scales(mins);
#pragma GCC unroll 16
    for (int r = 0; r < 16; ++r) {
      const __m512 f = _mm512_cvtepi32_ps(load(isum + 16 * r));
      const __m512 t = _mm512_mul_ps(sv, _mm512_set1_ps(dx[r]));
      const __m512 u = _mm512_mul_ps(mv, _mm512_set1_ps(sx[r]));
      acc[r] = _mm512_add_ps(acc[r], _mm512_sub_ps(_mm512_mul_ps(f, t), u));
    }
  } else {
#pragma GCC unroll 16
    for (int r = 0; r < 16; ++r) {
      const __m512 t = _mm512_mul_ps(sv, _mm512_set1_ps(dx[r]));
      acc[r] = _mm512_add_ps(acc[r], _mm512_mul_ps(_mm512_cvtepi32_ps(load(isum + 16 * r)), t));
    }
  }
}

// Rows [row0, row0 + 16) of the layout against one column tile (B: b_operand's), every block in k order,
// into out [16][16] float32; `stream`: bops is read from memory here, prefetch ahead. Kind 0 (s8 without
// sub-scales, or s5 unpacked to it) or 1 (u4). s: the tile's scales (a block's 16 at b * s_step), mins (u4)
// likewise per block. Software-pipelined in quads of blocks: quad q + 1's four products go to four C tiles
// before quad q's float chains run (from the other half of c), so the tile unit works while the vector unit
// does (one C tile, block by block, ran 512 rows only 1.35x faster than the VNNI loop).
template <bool kU4, typename S>
void row_tile_plain(const uint8_t* bops, bool stream, const S* s, int64_t s_step, const S* mins, const Activations& a,
                    int64_t row0, float* out) {
  __m512 acc[16];
  for (int r = 0; r < 16; ++r) acc[r] = _mm512_setzero_ps();
  alignas(64) int32_t c[8][256];
  const int8_t* xq = a.q + row0 * kBlock;  // block b's rows at xq + b * x_step
  const int64_t x_step = a.m * kBlock, quads = a.blocks / 4;
  for (int64_t q = 0; q <= quads; ++q) {
    if (q < quads) {  // quad q's products, stored into c's half q & 1
      const int64_t b0 = 4 * q;
      if (stream)  // the weights' first read (s8 read in place): a later quad's 2 KB
        for (int l = 0; l < 32; ++l)
          _mm_prefetch(reinterpret_cast<const char*>(bops + b0 * 512 + kAhead + 64 * l), _MM_HINT_T0);
      SPECDEC_BLOCK_SUMS(0, 4, 6, xq + b0 * x_step, bops + b0 * 512, kU4);
      SPECDEC_BLOCK_SUMS(1, 5, 7, xq + (b0 + 1) * x_step, bops + (b0 + 1) * 512, kU4);
      SPECDEC_BLOCK_SUMS(2, 4, 6, xq + (b0 + 2) * x_step, bops + (b0 + 2) * 512, kU4);
      SPECDEC_BLOCK_SUMS(3, 5, 7, xq + (b0 + 3) * x_step, bops + (b0 + 3) * 512, kU4);
    }
    if (q > 0) {  // quad q - 1's chains, from the half its products were stored into
      int32_t(*from)[256] = c + 4 * ((q - 1) & 1);
      for (int j = 0; j < 4; ++j) {
        const int64_t blk = 4 * (q - 1) + j, first = blk * a.m + row0;
        chain_block<kU4>(acc, from[j], s + blk * s_step, kU4 ? mins + blk * kTile : mins, a.dx + first, a.sx + first);
      }
    }
    if (q < quads) {
      int32_t(*to)[256] = c + 4 * (q & 1);
      _tile_stored(0, to[0], 64);
      _tile_stored(1, to[1], 64);
      _tile_stored(2, to[2], 64);
      _tile_stored(3, to[3], 64);
    }
  }
  for (int64_t b = 4 * quads; b < a.blocks; ++b) {
    SPECDEC_BLOCK_SUMS(0, 4, 6, xq + b * x_step, bops + b * 512, kU4);
    _tile_stored(0, c[0], 64);
    const int64_t first = b * a.m + row0;
    chain_block<kU4>(acc, c[0], s + b * s_step, kU4 ? mins + b * kTile : mins, a.dx + first, a.sx + first);
  }
  for (int r = 0; r < 16; ++r) _mm512_store_ps(out + 16 * r, acc[r]);
}

// The same for s8 with Q6_K's sub-scales (tiles configured by int8_tile_config(true)): the block's halves'
// sums apart, then lo * sub_lo + hi * sub_hi in int32, as the VNNI loop.
template <typename S>
void row_tile_sub(const uint8_t* bops, const S* s, const int16_t* subs, const Activations& a, int64_t row0,
                  float* out) {
  __m512 acc[16];
  for (int r = 0; r < 16; ++r) acc[r] = _mm512_setzero_ps();
  alignas(64) int32_t c[3][256];
  for (int64_t b = 0; b < a.blocks; ++b) {
    const int8_t* xa = a.q + (b * a.m + row0) * kBlock;
    const uint8_t* wb = bops + b * 512;
    _tile_zero(0);
    _tile_zero(7);
    _tile_loadd(3, xa, kBlock);
    _tile_loadd(4, xa + 16, kBlock);
    _tile_loadd(5, wb, 64);
    _tile_loadd(6, wb + 256, 64);
    _tile_dpbssd(0, 3, 5);
    _tile_dpbssd(7, 4, 6);
    _tile_stored(0, c[0], 64);
    _tile_stored(7, c[1], 64);
    const __m512i pairs = load(subs + b * kTile * 2);  // column c's two int16 sub-scales -> int32 lane c
    const __m512i sub_lo = _mm512_srai_epi32(_mm512_slli_epi32(pairs, 16), 16), sub_hi = _mm512_srai_epi32(pairs, 16);
    for (int r = 0; r < 16; ++r)
      _mm512_store_si512(c[2] + 16 * r, _mm512_add_epi32(_mm512_mullo_epi32(load(c[0] + 16 * r), sub_lo),
                                                          _mm512_mullo_epi32(load(c[1] + 16 * r), sub_hi)));
    const int64_t first = b * a.m + row0;
    chain_block<false>(acc, c[2], s + b * kTile, s, a.dx + first, a.sx + first);
  }
  for (int r = 0; r < 16; ++r) _mm512_store_ps(out + 16 * r, acc[r]);
}

#undef SPECDEC_BLOCK_SUMS

// Every column tile against x's first m_size rows (a: the quantized rows, a.m of them) into y; the arguments
// as the VNNI loop's run_tiles. A last partial row tile reads past row a.m - 1 (the next block's rows, or the
// padding that run() leaves after the last block) and stores only its own rows: each row's sums and chain are
// its own, so the padding changes no bit, and the few rows left over no longer cost the VNNI loop a second
// pass over the weights.
template <typename S>
void amx_run_tiles(const S* sp, const at::Tensor& scales, const Activations& a, int64_t m_size,
                   const at::Tensor& quants, const at::Tensor& mins, const at::Tensor& sub_scales, int64_t kind,
                   bool sub, const specdec_quant::OutputRows& y) {
  const int64_t tiles = quants.size(0), tile_scales = a.blocks * kTile;
  const int64_t tile_bytes = a.blocks * block_bytes(kind);
  const int64_t s_step = specdec_quant::scale_step(scales, quants, kTile);  // s8: per block or per column
  const int64_t scales_per_tile = s_step == 0 ? kTile : tile_scales;
  const auto* qp = static_cast<const uint8_t*>(quants.data_ptr());
  const int16_t* subp = sub ? sub_scales.data_ptr<int16_t>() : nullptr;
  const S* minp = kind == 1 ? static_cast<const S*>(mins.data_ptr()) : nullptr;  // the scales' type
#pragma omp parallel num_threads(at::get_num_threads())
  {
    specdec_amx::ThreadTiles tile_state(int8_tile_config(sub));
    static thread_local std::vector<uint8_t> scratch;  // reused: the unpacked B operands of one column tile
    scratch.resize(kind == 0 ? 0 : a.blocks * 512);
    alignas(64) float out[256];
#pragma omp for schedule(static)
    for (int64_t t = 0; t < tiles; ++t) {
      const uint8_t* bops = b_operand(qp + t * tile_bytes, kind, a.blocks, scratch.data());
      const S* s = sp + t * scales_per_tile;
      for (int64_t row0 = 0; row0 < m_size; row0 += 16) {
        if (sub)
          row_tile_sub(bops, s, subp + t * tile_scales * 2, a, row0, out);
        else if (kind == 1)
          row_tile_plain<true>(bops, false, s, s_step, minp + t * tile_scales, a, row0, out);
        else
          row_tile_plain<false>(bops, kind == 0 && row0 == 0, s, s_step, s, a, row0, out);
        for (int64_t r = 0; r < std::min<int64_t>(16, m_size - row0); ++r) y.store(row0 + r, t * kTile, out + 16 * r, kTile);
      }
    }
  }
}

}  // namespace specdec_quant512

#pragma GCC pop_options
