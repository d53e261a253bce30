// Python bindings of the AVX2 + FMA kernels (built by models/fast_linear.py). On CPUs with AMX-BF16 the same
// module is built with SPECDEC_AMX and amx_rows_linear.cpp in place of avx2_rows_linear.cpp, on CPUs with
// AVX512-BF16 with bf16_rows_linear.cpp and (SPECDEC_PACKED_HEAD) bf16_packed_linear.cpp.
#include <torch/csrc/utils/pybind.h>  // not torch/extension.h: it takes minutes to compile
#include <pybind11/stl.h>

at::Tensor rows_linear(at::Tensor x, at::Tensor w);
int64_t rows_layer_linear_address();
#ifdef SPECDEC_AMX
bool amx_ready();
at::Tensor rows_argmax_linear(at::Tensor x, at::Tensor w);
at::Tensor rows_linear_bf16(at::Tensor x, at::Tensor w);
at::Tensor amx_pack_weight(at::Tensor w);
at::Tensor amx_packed_linear(at::Tensor x, at::Tensor packed, int64_t n_size, bool bf16_out);
int64_t amx_packed_layer_linear_address();
std::vector<at::Tensor> amx_int8_head(at::Tensor w);
std::tuple<at::Tensor, at::Tensor> amx_screened_argmax(at::Tensor x, at::Tensor q, at::Tensor scale, at::Tensor c1,
                                                       at::Tensor c2, at::Tensor w);
#endif
#ifdef SPECDEC_LANE_PANELS
at::Tensor lane_panel_pack(at::Tensor w);
at::Tensor lane_panel_linear(at::Tensor x, at::Tensor w, at::Tensor packed);
int64_t lane_panel_layer_linear_address();
#endif
#ifdef SPECDEC_PACKED_HEAD
at::Tensor pack_bf16_panels(at::Tensor w);
at::Tensor packed_rows_linear(at::Tensor x, at::Tensor packed, int64_t n_size, int64_t start, int64_t stop);
int64_t bf16_packed_layer_linear_address();
#endif
at::Tensor probs_values(at::Tensor probs, at::Tensor values, at::Tensor order, int64_t tokens);
at::Tensor qk_scores(at::Tensor q, at::Tensor keys_t);
at::Tensor rows_argmax(at::Tensor x);
std::vector<at::Tensor> int8_head_tiles(at::Tensor w);
std::vector<at::Tensor> screened_columns(at::Tensor x, at::Tensor q, at::Tensor scale, at::Tensor c1, at::Tensor c2,
                                         int64_t start, int64_t stop);
std::vector<at::Tensor> screened_max(at::Tensor x, at::Tensor q, at::Tensor scale, at::Tensor c1, at::Tensor c2,
                                     int64_t start, int64_t stop, at::Tensor w);
at::Tensor rms_norm_rows(at::Tensor x, at::Tensor scale, double eps, bool gemma);
at::Tensor gated_act_mul(at::Tensor gate_up, bool gelu);
at::Tensor softmax_rows(at::Tensor scores, int64_t first);
at::Tensor rope_rows(at::Tensor x, at::Tensor cos, at::Tensor sin);
at::Tensor draft_attention(at::Tensor q, std::vector<at::Tensor> keys, std::vector<at::Tensor> values,
                           std::vector<int64_t> rows, double scale, std::vector<at::Tensor> slots);
at::Tensor attention_batch(at::Tensor q, at::Tensor k, at::Tensor v, std::vector<at::Tensor> keys_t,
                           std::vector<at::Tensor> values, std::vector<at::Tensor> masks,
                           std::vector<at::Tensor> orders, std::vector<int64_t> starts, std::vector<int64_t> ends,
                           std::vector<int64_t> slots, at::Tensor positions, int64_t window, double scale,
                           std::vector<at::Tensor> keys_rows, std::vector<at::Tensor> values_t);
at::Tensor decoder_layer_call(at::Tensor h, int64_t linear_address, std::vector<at::Tensor> tiles,
                              std::vector<int64_t> kinds, std::vector<int64_t> out_features,
                              std::vector<at::Tensor> norms, double eps, bool gemma, bool gelu,
                              std::vector<int64_t> dims, at::Tensor cos, at::Tensor sin,
                              std::vector<at::Tensor> keys_t, std::vector<at::Tensor> values,
                              std::vector<at::Tensor> masks, std::vector<at::Tensor> orders,
                              std::vector<int64_t> starts, std::vector<int64_t> ends, std::vector<int64_t> slots,
                              at::Tensor positions, int64_t window, double attn_scale,
                              std::vector<at::Tensor> keys_rows, std::vector<at::Tensor> values_t);
at::Tensor draft_layer_call(at::Tensor h, at::Tensor e, int64_t linear_address, std::vector<at::Tensor> tiles,
                            std::vector<int64_t> kinds, std::vector<int64_t> out_features,
                            std::vector<at::Tensor> norms, double eps, bool norm_before_residual,
                            std::vector<int64_t> dims, at::Tensor cos, at::Tensor sin, std::vector<at::Tensor> k_bufs,
                            std::vector<at::Tensor> v_bufs, std::vector<int64_t> lengths, std::vector<int64_t> rows,
                            double scale, std::vector<at::Tensor> slots);
#ifdef SPECDEC_AMX
bool amx_values_ready(int64_t dim);
#endif

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
#ifdef SPECDEC_AMX
  m.def("amx_ready", &amx_ready, "whether the OS gave this process the AMX tile state");
  m.def("rows_linear_bf16", &rows_linear_bf16, "x @ w.T for bfloat16 rows, row-independent, rounded to "
        "bfloat16 as rows_linear(x, w).to(torch.bfloat16)");
  m.def("amx_pack_weight", &amx_pack_weight, "a bfloat16 weight [N, K] in the AMX B layout, once");
  m.def("amx_packed_linear", &amx_packed_linear, "x @ w.T for amx_pack_weight(w): the bits of rows_linear");
  m.def("amx_packed_layer_linear_address", &amx_packed_layer_linear_address, "amx_packed_linear with "
        "quant_linear's signature, as a function address for decoder_layer_call");
  m.def("rows_argmax_linear", &rows_argmax_linear, "argmax of each row of x @ w.T (bfloat16), as "
        "rows_argmax(rows_linear(x, w)) without the logits");
  m.def("amx_int8_head", &amx_int8_head, "an LM head [V, K] as int8 rows with the factors of "
        "amx_screened_argmax's bound: (q, scale, c1, c2), or () when it has a non-finite value");
  m.def("amx_screened_argmax", &amx_screened_argmax, "(rows_argmax_linear(x, w), columns rechecked per row) "
        "from amx_int8_head(w): the int8 head rules columns out, the bfloat16 one decides");
#endif
  m.def("rows_linear", &rows_linear, "float32 x @ w.T for bfloat16 rows, row-independent");
  m.def("rows_layer_linear_address", &rows_layer_linear_address, "rows_linear with quant_linear's signature, "
        "for decoder_layer_call and draft_layer_call with bfloat16 weights as they are (its address)");
#ifdef SPECDEC_LANE_PANELS
  m.def("lane_panel_pack", &lane_panel_pack, "a bfloat16 weight [N, K] as lane panels (avx2_lane_panels.h)");
  m.def("lane_panel_linear", &lane_panel_linear, "rows_linear(x, w) through w's lane panels: the same bits, "
        "faster for 8 rows and more");
  m.def("lane_panel_layer_linear_address", &lane_panel_layer_linear_address, "lane_panel_linear with "
        "quant_linear's signature, for decoder_layer_call with the lane panels in the tile after each weight");
#endif
#ifdef SPECDEC_PACKED_HEAD
  m.def("pack_bf16_panels", &pack_bf16_panels, "a bfloat16 weight [N, K] in 16-column panels of k pairs");
  m.def("packed_rows_linear", &packed_rows_linear, "float32 x @ w.T over columns [start, stop) of a packed w, "
        "row-independent");
  m.def("bf16_packed_layer_linear_address", &bf16_packed_layer_linear_address, "packed_rows_linear with "
        "quant_linear's signature, as a function address for the one-call layers");
#endif
  m.def("int8_head_tiles", &int8_head_tiles, "an LM head [V, K] as int8 tiles of 8 columns with the factors of "
        "screened_columns' bound: (q, scale, c1, c2), or () when it has a non-finite value");
  m.def("screened_columns", &screened_columns, "(columns, offsets): per row, the columns in [start, stop) that "
        "int8_head_tiles(w) cannot rule out as the row's first maximum of x @ w.T; () where it does not apply");
  m.def("screened_max", &screened_max, "(values, indices): per row, the first maximum of rows_linear(x, w) over "
        "[start, stop) and its logit, from screened_columns' candidates scored exactly; () where it does not apply");
  m.def("probs_values", &probs_values, "attention probs @ values, per-row slot order, row-independent");
  m.def("qk_scores", &qk_scores, "float32 attention scores q @ keys_t, row-independent");
  m.def("rms_norm_rows", &rms_norm_rows, "RMSNorm of bfloat16 rows, bfloat16 out, one fixed order per row");
  m.def("gated_act_mul", &gated_act_mul, "act(gate) * up for gate_up = [gate | up] (tanh GELU or SiLU), "
        "bfloat16 in and out, each value alone");
  m.def("softmax_rows", &softmax_rows, "attention softmax of float32 score rows whose column c is cache slot "
        "first + c, bfloat16 out; a row's bits do not depend on its length past its visible columns");
  m.def("rope_rows", &rope_rows, "rotary embedding of bfloat16 rows, the bits of x * cos + roll(x, D / 2) * sin");
  m.def("rows_argmax", &rows_argmax, "argmax of each float32 row (first maximum; first NaN), as torch.argmax");
  m.def("draft_attention", &draft_attention, "the drafters' attention of every sequence of a step over its own "
        "float32 cache (causal, or a tree level's listed entries), float32 out", py::arg("q"), py::arg("keys"),
        py::arg("values"), py::arg("rows"), py::arg("scale"), py::arg("slots") = std::vector<at::Tensor>());
  const auto none = std::vector<at::Tensor>();
  m.def("decoder_layer_call", &decoder_layer_call, "one decoder layer in one call, its linears through a function "
        "address: decoder.DecoderLayer.forward_batch's kernels in its order, the same bits", py::arg("h"),
        py::arg("linear_address"), py::arg("tiles"), py::arg("kinds"), py::arg("out_features"), py::arg("norms"),
        py::arg("eps"), py::arg("gemma"), py::arg("gelu"), py::arg("dims"), py::arg("cos"), py::arg("sin"),
        py::arg("keys_t"), py::arg("values"), py::arg("masks"), py::arg("orders"), py::arg("starts"),
        py::arg("ends"), py::arg("slots"), py::arg("positions"), py::arg("window"), py::arg("attn_scale"),
        py::arg("keys_rows") = none, py::arg("values_t") = none);
  m.def("draft_layer_call", &draft_layer_call, "EAGLE-3's draft layer in one call: eagle3_model.Eagle3Drafter."
        "step_batch's kernels and ops in its order, the same bits; writes each sequence's new cache entries",
        py::arg("h"), py::arg("e"), py::arg("linear_address"), py::arg("tiles"), py::arg("kinds"),
        py::arg("out_features"), py::arg("norms"), py::arg("eps"), py::arg("norm_before_residual"), py::arg("dims"),
        py::arg("cos"), py::arg("sin"), py::arg("k_bufs"), py::arg("v_bufs"), py::arg("lengths"), py::arg("rows"),
        py::arg("scale"), py::arg("slots"));
  m.def("attention_batch", &attention_batch, "one layer's attention for every sequence of a batch, as "
        "decoder.attention computes it per sequence", py::arg("q"), py::arg("k"), py::arg("v"), py::arg("keys_t"),
        py::arg("values"), py::arg("masks"), py::arg("orders"), py::arg("starts"), py::arg("ends"), py::arg("slots"),
        py::arg("positions"), py::arg("window"), py::arg("scale"), py::arg("keys_rows") = none,
        py::arg("values_t") = none);
#ifdef SPECDEC_AMX
  m.def("amx_attention_ready", &amx_values_ready, "whether attention runs on AMX tiles for this head dim (the KV "
        "cache then stores its tile layout)");
#endif
}
