// Python bindings of the AVX2 + FMA kernels (built by models/fast_linear.py on CPUs without AVX512-BF16).
#include <torch/csrc/utils/pybind.h>  // not torch/extension.h: it takes minutes to compile

at::Tensor rows_linear(at::Tensor x, at::Tensor w);
at::Tensor probs_values(at::Tensor probs, at::Tensor values, at::Tensor order, int64_t tokens);
at::Tensor qk_scores(at::Tensor q, at::Tensor keys_t);

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("rows_linear", &rows_linear, "float32 x @ w.T for bfloat16 rows, row-independent");
  m.def("probs_values", &probs_values, "attention probs @ values, per-row slot order, row-independent");
  m.def("qk_scores", &qk_scores, "float32 attention scores q @ keys_t, row-independent");
}
