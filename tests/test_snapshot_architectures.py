"""The HF folder our loader writes from a GGUF file names its model class (`architectures`), as
`save_pretrained` would: vLLM picks the class from that field and needs no `hf_overrides`."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from specdec.models import loading


def _tiny_llama_gguf(path: Path) -> Path:
    """A 2-layer random Llama GGUF with a 64-token BPE vocabulary: what transformers' GGUF reader needs."""
    from gguf import GGUFWriter, TokenType

    vocab, hidden, layers, ffn, heads, kv_heads = 64, 32, 2, 64, 4, 2
    head_dim = hidden // heads
    writer = GGUFWriter(str(path), "llama")
    writer.add_context_length(128)
    writer.add_embedding_length(hidden)
    writer.add_block_count(layers)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_dimension_count(head_dim)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_vocab_size(vocab)
    tokens = ["<s>", "</s>"] + [f"t{i}" for i in range(vocab - 2)]
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types([TokenType.CONTROL] * 2 + [TokenType.NORMAL] * (vocab - 2))
    writer.add_token_scores([0.0] * vocab)
    writer.add_token_merges([])
    writer.add_bos_token_id(0)
    writer.add_eos_token_id(1)
    rng = np.random.default_rng(0)

    def rand(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.1).astype(np.float32)

    writer.add_tensor("token_embd.weight", rand(vocab, hidden))
    writer.add_tensor("output_norm.weight", np.ones(hidden, np.float32))
    writer.add_tensor("output.weight", rand(vocab, hidden))
    for i in range(layers):
        for name, shape in (("attn_q", (hidden, hidden)), ("attn_k", (kv_heads * head_dim, hidden)),
                            ("attn_v", (kv_heads * head_dim, hidden)), ("attn_output", (hidden, hidden)),
                            ("ffn_gate", (ffn, hidden)), ("ffn_up", (ffn, hidden)), ("ffn_down", (hidden, ffn))):
            writer.add_tensor(f"blk.{i}.{name}.weight", rand(*shape))
        writer.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(hidden, np.float32))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(hidden, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_gguf_snapshot_names_its_class_and_old_snapshots_get_it(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    gguf = _tiny_llama_gguf(tmp_path / "tiny.gguf")
    folder = loading._gguf_snapshot(gguf, torch.bfloat16)
    config_path = folder / "config.json"
    assert json.loads(config_path.read_text())["architectures"] == ["LlamaForCausalLM"]

    # a snapshot written before the field existed is completed when it is next used
    config = json.loads(config_path.read_text())
    config["architectures"] = None
    config_path.write_text(json.dumps(config))
    assert loading._gguf_snapshot(gguf, torch.bfloat16) == folder
    assert json.loads(config_path.read_text())["architectures"] == ["LlamaForCausalLM"]


@pytest.mark.parametrize("model_type,expected", [("gemma3_text", "Gemma3ForCausalLM"), ("qwen3", "Qwen3ForCausalLM"),
                                                 ("mistral", "MistralForCausalLM"), ("qwen2", "Qwen2ForCausalLM")])
def test_missing_architectures_come_from_the_model_type(tmp_path, model_type, expected):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": model_type}))
    loading._add_architectures(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["architectures"] == [expected]


def test_unknown_model_type_is_a_clear_error(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "no-such-model"}))
    with pytest.raises(ValueError, match="no causal-LM class known for model type 'no-such-model'"):
        loading._add_architectures(tmp_path)
