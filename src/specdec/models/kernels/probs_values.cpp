// out = probs @ values for attention, each query row reading the value slots in its own order.
//
// Why: a draft-tree token must sum its attention terms in the order a chain would (see
// models/attention_mask.py tree_slot_order), which torch can only do by copying the whole value cache once
// per token. Here row r of head h reads values[h, order[r % tokens, s]] for s = 0, 1, ... without a copy.
// Every output element is a float32 fused multiply-add chain over s in ascending order, skipping zero
// probabilities (masked slots: adding 0 changes no sum), so a row's result depends only on its own
// probabilities and values, never on how many rows or which cache length share the call.
#include <torch/extension.h>
#include <immintrin.h>

namespace {

inline __m512 load_bf16(const uint16_t* p, __mmask16 mask) {
  const __m256i raw = _mm256_maskz_loadu_epi16(mask, p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}

inline float bf16_to_float(uint16_t b) {
  uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

}  // namespace

torch::Tensor probs_values(torch::Tensor probs, torch::Tensor values, torch::Tensor order, int64_t tokens) {
  TORCH_CHECK(probs.scalar_type() == at::kBFloat16 && values.scalar_type() == at::kBFloat16, "bfloat16 only");
  TORCH_CHECK(probs.dim() == 3 && values.dim() == 3 && probs.size(0) == values.size(0) &&
              probs.size(2) == values.size(1), "probs [H, R, S] and values [H, S, D]");
  probs = probs.contiguous();
  values = values.contiguous();
  const int64_t heads = probs.size(0), rows = probs.size(1), slots = probs.size(2), dim = values.size(2);
  const bool ordered = order.numel() > 0;
  if (ordered) {
    order = order.to(at::kLong).contiguous();
    TORCH_CHECK(order.dim() == 2 && order.size(0) == tokens && order.size(1) == slots && rows % tokens == 0,
                "order [tokens, S], rows a multiple of tokens");
  }
  auto out = torch::empty({heads, rows, dim}, probs.options());
  const auto* pp = reinterpret_cast<const uint16_t*>(probs.data_ptr<at::BFloat16>());
  const auto* vp = reinterpret_cast<const uint16_t*>(values.data_ptr<at::BFloat16>());
  const int64_t* op = ordered ? order.data_ptr<int64_t>() : nullptr;
  auto* outp = reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>());
  constexpr int64_t kMaxChunks = 32;  // head_dim up to 512
  TORCH_CHECK(dim <= 16 * kMaxChunks, "head_dim up to 512");
  const int64_t chunks = (dim + 15) / 16;
  const __mmask16 tail = dim % 16 == 0 ? (__mmask16)0xFFFF : (__mmask16)((1u << (dim % 16)) - 1);
#pragma omp parallel for schedule(static) num_threads(at::get_num_threads())
  for (int64_t hr = 0; hr < heads * rows; ++hr) {
    const int64_t h = hr / rows, r = hr % rows;
    const uint16_t* prow = pp + hr * slots;
    const int64_t* orow = ordered ? op + (r % tokens) * slots : nullptr;
    const uint16_t* vhead = vp + h * slots * dim;
    __m512 acc[kMaxChunks];
    for (int64_t c = 0; c < chunks; ++c) acc[c] = _mm512_setzero_ps();
    for (int64_t s = 0; s < slots; ++s) {
      const uint16_t pb = prow[s];
      if ((pb & 0x7FFF) == 0) continue;
      const __m512 p = _mm512_set1_ps(bf16_to_float(pb));
      const uint16_t* v = vhead + (ordered ? orow[s] : s) * dim;
      for (int64_t c = 0; c < chunks; ++c)
        acc[c] = _mm512_fmadd_ps(p, load_bf16(v + 16 * c, c == chunks - 1 ? tail : (__mmask16)0xFFFF), acc[c]);
    }
    for (int64_t c = 0; c < chunks; ++c) {
      // round to nearest even, as torch's float -> bfloat16 conversion does (values are finite)
      const __m512i bits = _mm512_castps_si512(acc[c]);
      const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
      const __m512i rounded =
          _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(bits, _mm512_set1_epi32(0x7FFF)), lsb), 16);
      _mm256_mask_storeu_epi16(outp + hr * dim + 16 * c, c == chunks - 1 ? tail : (__mmask16)0xFFFF,
                               _mm512_cvtepi32_epi16(rounded));
    }
  }
  return out;
}
