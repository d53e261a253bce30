// The tile state of the AMX attention kernels (amx_qk_scores.cpp, amx_probs_values.cpp): one configuration
// for a thread's whole run of attention calls.
//
// Why: a batched decode step runs both kernels once per sequence and layer, each on a few rows; saving,
// loading and restoring the tile configuration around every call (ThreadTiles) cost about as much as their
// multiplies and made plain decoding of 32 sequences a tenth slower. attention_batch's threads open one
// scope for all their sequences; a kernel called inside it finds its tiles configured.
#pragma once

#include "amx_tiles.h"

#pragma GCC push_options
#pragma GCC target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl")

namespace specdec_amx {

inline thread_local int attention_depth = 0;
inline thread_local TileConfig attention_before;

// The bf16 configuration (16 rows x 64 bytes, every tile) for this thread until the outermost scope closes,
// which puts back what the thread had (see ThreadTiles).
inline void attention_tiles_enter() {
  if (attention_depth++ > 0) return;
  _tile_storeconfig(&attention_before);
  // static: a local's stores may be dropped by the compiler, which does not see ldtilecfg read them
  static const TileConfig cfg = bf16_tile_config();
  _tile_loadconfig(&cfg);
}

inline void attention_tiles_leave() {
  if (--attention_depth > 0) return;
  if (attention_before.palette_id != 0)
    _tile_loadconfig(&attention_before);
  else
    _tile_release();
}

class AttentionTiles {
 public:
  AttentionTiles() { attention_tiles_enter(); }
  ~AttentionTiles() { attention_tiles_leave(); }
  AttentionTiles(const AttentionTiles&) = delete;
  AttentionTiles& operator=(const AttentionTiles&) = delete;
};

// Zeros the four accumulator tiles the attention kernels use (C 0-3).
inline void zero_accumulators() {
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
}

}  // namespace specdec_amx

#pragma GCC pop_options
