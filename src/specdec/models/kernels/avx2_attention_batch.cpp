// One layer's attention for every sequence of a batched forward, in one call.
//
// Why: decoder.attention runs about a dozen small torch ops per sequence and layer; from Python each costs
// microseconds of dispatch, so at 32 decoding sequences the loop over sequences cost more than the attention
// arithmetic (about 60 ms of a 300 ms step for Gemma 3 270M). This runs the same ops in the same order on the
// same tensors (the KV write, qk_scores, scale, tree gather, mask, softmax, bfloat16 rounding,
// probs_values), so every sequence's bits are those of decoder.attention alone; only the dispatch moves to
// C++, and small sequences run on the threads side by side instead of one after another.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/Parallel.h>
#include <ATen/ThreadLocalState.h>
#include <omp.h>

#include <exception>
#include <vector>

at::Tensor qk_scores(at::Tensor q, at::Tensor keys_t);
at::Tensor probs_values(at::Tensor probs, at::Tensor values, at::Tensor order, int64_t tokens);

namespace {

// A sequence with more rows than this runs alone, with the kernels' own threads (a prefill chunk).
constexpr int64_t kSmallRows = 16;

void one_sequence(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& keys_t,
                  const at::Tensor& values, const at::Tensor& mask, const at::Tensor& order, int64_t start,
                  int64_t end, int64_t slot, double scale, at::Tensor& out) {
  const int64_t t = end - start, kv_heads = keys_t.size(0), heads = q.size(1), dim = q.size(2);
  const int64_t groups = heads / kv_heads;
  // KVCache.write: pending slots [slot, slot + t)
  keys_t.narrow(2, slot, t).copy_(k.narrow(0, start, t).permute({1, 2, 0}));
  values.narrow(1, slot, t).copy_(v.narrow(0, start, t).transpose(0, 1));
  const auto qs = q.narrow(0, start, t).view({t, kv_heads, groups, dim}).permute({1, 2, 0, 3})
                      .reshape({kv_heads, groups * t, dim});
  auto scores = qk_scores(qs, keys_t).mul_(scale);
  const bool tree = order.numel() > 0;
  if (tree) scores = scores.gather(-1, order.repeat({groups, 1}).expand({kv_heads, -1, -1}));
  const auto probs = scores.add_(mask).softmax(-1).to(at::kBFloat16);
  const auto pv = probs_values(probs, values, order, t);
  out.narrow(0, start, t).copy_(pv.view({kv_heads, groups, t, dim}).permute({2, 0, 1, 3}).reshape({t, heads * dim}));
}

}  // namespace

// q [N, heads, dim], k and v [N, kv_heads, dim] (bfloat16): the rows of every sequence, one after another;
// per sequence i: rows [starts[i], ends[i]), its layer's cache buffers keys_t [kv_heads, dim, capacity]
// and values [kv_heads, capacity, dim], where its pending slots start (slots[i]), its additive float32 mask
// [groups * T, capacity] and its tree slot order [T, capacity] (empty for a chain). Returns [N, heads * dim].
at::Tensor attention_batch(at::Tensor q, at::Tensor k, at::Tensor v, std::vector<at::Tensor> keys_t,
                           std::vector<at::Tensor> values, std::vector<at::Tensor> masks,
                           std::vector<at::Tensor> orders, std::vector<int64_t> starts, std::vector<int64_t> ends,
                           std::vector<int64_t> slots, double scale) {
  const int64_t n = static_cast<int64_t>(keys_t.size());
  TORCH_CHECK(static_cast<int64_t>(values.size()) == n && static_cast<int64_t>(masks.size()) == n &&
                  static_cast<int64_t>(orders.size()) == n && static_cast<int64_t>(slots.size()) == n &&
                  static_cast<int64_t>(starts.size()) == n && static_cast<int64_t>(ends.size()) == n,
              "one cache, mask, order, row span and slot per sequence");
  TORCH_CHECK(q.scalar_type() == at::kBFloat16 && q.dim() == 3 && k.dim() == 3 && v.dim() == 3, "bfloat16 q, k, v");
  auto out = at::empty({q.size(0), q.size(1) * q.size(2)}, q.options());
  std::vector<int64_t> small, large;
  for (int64_t i = 0; i < n; ++i) (ends[i] - starts[i] <= kSmallRows ? small : large).push_back(i);
  if (small.size() == 1) large.push_back(small[0]), small.clear();  // no team for one: see below
  for (int64_t i : large)
    one_sequence(q, k, v, keys_t[i], values[i], masks[i], orders[i], starts[i], ends[i], slots[i], scale, out);
  const int64_t m = static_cast<int64_t>(small.size());
  // Inside this region torch's and our kernels' own parallel loops run serially (in_parallel_region), and
  // nothing they compute depends on the thread count. (A region serialised by an `if` clause would not count
  // as parallel, and the loops inside would start a nested team on every call: milliseconds each.) An exception may not leave an OpenMP region: the
  // first one is kept and rethrown after it.
  std::exception_ptr error;
  const at::ThreadLocalState caller;  // grad / inference mode and the rest, as at::parallel_for passes them on
#pragma omp parallel for schedule(dynamic, 1) num_threads(at::get_num_threads())
  for (int64_t j = 0; j < m; ++j) {
    const int64_t i = small[j];
    try {
      const at::ThreadLocalStateGuard same_state(caller);
      one_sequence(q, k, v, keys_t[i], values[i], masks[i], orders[i], starts[i], ends[i], slots[i], scale,
                   out);
    } catch (...) {
#pragma omp critical
      if (!error) error = std::current_exception();
    }
  }
  if (error) std::rethrow_exception(error);
  return out;
}
