"""`specdec drafter export-vllm`: the layouts vLLM 0.32 loads, and refusals that say why (no vLLM needed)."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from specdec.cli import main
from specdec.drafting.eagle3_format import load_eagle3
from specdec.drafting.medusa_format import load_medusa
from specdec.drafting.vllm_export import NO_EAGLE3_INTERFACE, ExportRefused, export_for_vllm, refusal

from eagle3_helpers import make_random_eagle3
from medusa_helpers import make_random_medusa
from test_medusa import _same_greedy


def test_medusa_sharing_the_target_head_is_written_with_the_whole_head(zoo, tmp_path):
    """No token_map (vLLM 0.32 cannot load one): the target's whole LM head, stored once."""
    target = zoo.load("llama")
    source = make_random_medusa(target, tmp_path / "d", draft_vocab_size=120)
    config = export_for_vllm(tmp_path / "d", target, zoo.path("llama"), tmp_path / "v")
    assert source and config["model_type"] == "medusa" and config["original_lm_head"] is True
    assert config["truncated_vocab_size"] == config["vocab_size"] == target.vocab_size
    saved = load_file(str(tmp_path / "v" / "model.safetensors"))
    assert "token_map" not in saved and "lm_heads.1.weight" not in saved
    torch.testing.assert_close(saved["lm_heads.0.weight"], target.decoder.head_weight().to(saved["lm_heads.0.weight"].dtype))
    assert sorted(k for k in saved if k.startswith("blocks.0.")) == ["blocks.0.layers.0.bias", "blocks.0.layers.0.weight"]
    heads, _ = load_medusa(tmp_path / "v", target)  # specdec reads the export back, lossless as any drafter
    assert heads.config.draft_vocab_size == target.vocab_size
    _same_greedy(target, {"method": "medusa", "model": str(tmp_path / "v"), "medusa_choices": [[0], [0, 0]]})


def test_medusa_with_own_reduced_heads_needs_the_token_map(zoo, tmp_path):
    target = zoo.load("llama")
    make_random_medusa(target, tmp_path / "d", draft_vocab_size=120, own_lm_heads=True)
    with pytest.raises(ExportRefused, match=r"Following weights were not initialized from checkpoint: \{'token_map'\}"):
        export_for_vllm(tmp_path / "d", target, zoo.path("llama"), tmp_path / "v")
    config = export_for_vllm(tmp_path / "d", target, zoo.path("llama"), tmp_path / "v", token_map=True)
    assert config["truncated_vocab_size"] == 120 and "token_map" in load_file(str(tmp_path / "v" / "model.safetensors"))


def test_eagle3_export_stores_the_draft_vocab_head_and_specdec_still_loads_it(zoo, tmp_path):
    target = zoo.load("llama")
    make_random_eagle3(target, tmp_path / "d", draft_vocab_size=100)
    config = json.loads((tmp_path / "d" / "config.json").read_text())
    config["speculators_config"]["proposal_methods"].append({"proposal_type": "dynamic_tree", "speculative_tokens": 6})
    (tmp_path / "d" / "config.json").write_text(json.dumps(config))
    written = export_for_vllm(tmp_path / "d", target, zoo.path("llama"), tmp_path / "v")
    speculators = written["speculators_config"]
    assert speculators["verifier"]["name_or_path"] == zoo.path("llama")
    assert speculators["verifier"]["architectures"] == ["LlamaForCausalLM"]
    assert [m["proposal_type"] for m in speculators["proposal_methods"]] == ["greedy"]  # what speculators defines
    assert len(written["specdec"]["proposal_methods"]) == 2
    # vLLM sizes the draft's fc from this, else assumes 3 aux layers (the tiny target has 2)
    assert written["transformer_layer_config"]["num_aux_hidden_states"] == len(written["eagle_aux_hidden_state_layer_ids"])
    saved = load_file(str(tmp_path / "v" / "model.safetensors"))
    ids = torch.arange(100) + saved["d2t"]
    torch.testing.assert_close(saved["lm_head.weight"], target.decoder.head_weight()[ids].to(saved["lm_head.weight"].dtype))
    assert "t2d" in saved and "embed_tokens.weight" not in saved  # vLLM skips t2d; the embedding is the target's
    drafter, _ = load_eagle3(tmp_path / "v", target)
    assert drafter.draft_ids().tolist() == ids.tolist()


@pytest.mark.parametrize("kind,arch,expected", [
    ("eagle3", "Gemma3ForCausalLM", NO_EAGLE3_INTERFACE),
    ("dflash", "Gemma3ForCausalLM", NO_EAGLE3_INTERFACE),
    ("dflash", "LlamaForCausalLM", None),
    ("dflash", "Qwen3ForCausalLM", None),
    ("mtp", "LlamaForCausalLM", "no loader for a standalone MTP drafter"),
    ("eagle3", "LlamaForCausalLM", None),
    ("eagle3", "Qwen3ForCausalLM", None),
    ("medusa", "Gemma3ForCausalLM", None),
])
def test_refusals_name_the_reason(kind, arch, expected):
    reason = refusal(kind, [arch])
    assert reason is None if expected is None else expected in reason


def test_cli_refuses_before_loading_the_target(zoo, tmp_path, capsys, monkeypatch):
    folder = tmp_path / "mtp"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"speculators_model_type": "mtp"}))
    import specdec.models.loading as loading

    monkeypatch.setattr(loading, "load_model", lambda *a, **k: pytest.fail("the target was loaded"))
    code = main(["drafter", "export-vllm", str(folder), "--target", zoo.path("llama"), "--output", str(tmp_path / "o")])
    assert code == 2
    assert "no loader for a standalone MTP drafter" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
