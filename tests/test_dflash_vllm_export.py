"""`export-vllm` for DFlash drafters: the config and tensors vLLM 0.32 reads (`qwen3_dflash.py`), refusals, and
the export read back by specdec as the speculators checkpoint it is (no vLLM needed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from specdec import SamplingParams
from specdec.drafting.dflash import DFlashOptions, DFlashProposer
from specdec.drafting.dflash_format import AUX_MARKER, aux_layer_outputs, load_dflash, save_dflash
from specdec.drafting.dflash_model import DFlashDrafter
from specdec.drafting.dflash_vllm import write_vllm_dflash
from specdec.drafting.vllm_export import NO_EAGLE3_INTERFACE, ExportRefused, export_for_vllm
from specdec.training.dflash_objective import default_dflash_config

SHIPPED = Path(__file__).resolve().parent.parent / "src" / "specdec" / "drafters"


def make_dflash(target, folder: Path, draft_vocab_size: int | None = None, aux_layers: list[int] | None = None,
                block_size: int = 8, seed: int = 0) -> Path:
    size = draft_vocab_size or target.vocab_size
    ids = torch.randperm(target.vocab_size, generator=torch.Generator().manual_seed(seed))[:size].sort().values
    torch.manual_seed(seed)
    drafter = DFlashDrafter(default_dflash_config(target, size, block_size=block_size, num_layers=2,
                                                  aux_layers=aux_layers))
    with torch.no_grad():  # the norms' weights away from 1, so a transposed or misnamed tensor would show
        for name, p in drafter.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    drafter.set_draft_vocab(ids)
    save_dflash(folder, drafter.to(target.dtype), target)
    return folder


def read(folder: Path) -> tuple[dict, dict[str, torch.Tensor]]:
    return json.loads((folder / "config.json").read_text()), load_file(str(folder / "model.safetensors"))


def test_reduced_vocab_export_states_what_vllm_reads(zoo, tmp_path):
    target = zoo.load("qwen3")
    make_dflash(target, tmp_path / "d", draft_vocab_size=100, aux_layers=[0, 2])
    before, source = read(tmp_path / "d")
    written = export_for_vllm(tmp_path / "d", target, zoo.path("qwen3"), tmp_path / "v")
    config, saved = read(tmp_path / "v")
    assert written == config
    # speculators/vLLM: the residual stream entering layer id = the output of layer id - 1
    assert config["aux_hidden_state_layer_ids"] == [1, 3]
    assert AUX_MARKER not in config["specdec"] and aux_layer_outputs(config) == [0, 2]
    assert config["sliding_window_non_causal"] is True
    layer = config["transformer_layer_config"]
    assert layer["is_causal"] is False
    theta = before["transformer_layer_config"]["rope_theta"]
    assert layer["rope_theta"] == theta and layer["rope_parameters"] == {"rope_type": "default", "rope_theta": theta}
    assert layer["max_position_embeddings"] >= target.config.get_text_config().max_position_embeddings
    assert layer["vocab_size"] == target.vocab_size and config["draft_vocab_size"] == 100
    speculators = config["speculators_config"]
    assert speculators["verifier"]["name_or_path"] == zoo.path("qwen3")
    assert speculators["verifier"]["architectures"] == ["Qwen3ForCausalLM"]
    assert [m["speculative_tokens"] for m in speculators["proposal_methods"]] == [7]  # block_size - 1
    assert config["mask_token_id"] == before["mask_token_id"] and config["sample_from_anchor"] is False
    assert config["specdec"]["shares_target_lm_head"] is False

    assert set(saved) == (set(source) - {"t2d"}) | {"lm_head.weight"}  # no embedding: vLLM shares the target's
    for name in set(source) - {"t2d"}:
        assert saved[name].dtype == source[name].dtype and torch.equal(saved[name], source[name])
    ids = torch.arange(100) + saved["d2t"]
    assert saved["d2t"].dtype == torch.long and ids.tolist() == source["t2d"].nonzero().flatten().tolist()
    head = saved["lm_head.weight"]
    assert head.shape == (100, target.config.hidden_size) and head.dtype == torch.bfloat16
    assert torch.equal(head, target.decoder.head_weight()[ids].to(torch.bfloat16))


def test_full_vocab_export_shares_the_target_head_and_has_no_vocab_map(zoo, tmp_path):
    target = zoo.load("qwen3")
    make_dflash(target, tmp_path / "d")
    config = export_for_vllm(tmp_path / "d", target, zoo.path("qwen3"), tmp_path / "v")
    _, saved = read(tmp_path / "v")
    # vLLM has no d2t parameter at a full draft vocabulary (loading one fails) and shares the target's head
    assert not {"lm_head.weight", "d2t", "t2d", "embed_tokens.weight"} & set(saved)
    assert config["specdec"]["shares_target_lm_head"] is True
    drafter, _ = load_dflash(tmp_path / "v", target)
    assert drafter.draft_ids().tolist() == list(range(target.vocab_size)) and bool(drafter.t2d.all())


@pytest.mark.parametrize("aux_layers", [[2, 0], [1, 1]])
def test_unsorted_or_repeated_aux_layers_are_refused(zoo, tmp_path, aux_layers):
    target = zoo.load("qwen3")
    make_dflash(target, tmp_path / "d", aux_layers=aux_layers)
    with pytest.raises(ExportRefused, match="each aux layer once, in ascending order"):
        export_for_vllm(tmp_path / "d", target, zoo.path("qwen3"), tmp_path / "v")
    assert not (tmp_path / "v").exists()


def test_gemma3_target_is_refused(zoo, tmp_path):
    target = zoo.load("gemma3_text")
    make_dflash(target, tmp_path / "d", draft_vocab_size=100)
    with pytest.raises(ExportRefused, match=NO_EAGLE3_INTERFACE):
        export_for_vllm(tmp_path / "d", target, zoo.path("gemma3_text"), tmp_path / "v")
    # past that refusal, its scaled embedding is refused too (vLLM's draft embeds unscaled)
    with pytest.raises(ValueError, match="scales its embeddings"):
        write_vllm_dflash(tmp_path / "d", target, zoo.path("gemma3_text"), tmp_path / "v")


def _drafts(target, folder: Path, prompt: list[int], steps: int) -> list[list[int]]:
    """Teacher-forced drafts of `steps` chain steps, the target's greedy token committed after each."""
    proposer = DFlashProposer(DFlashOptions(model=str(folder), context_vocab=False), target)
    runtime = target.new_runtime()
    runtime.reset(256)
    prefill = runtime.prefill(prompt, capture=proposer.target_layers)
    proposer.begin(prompt, SamplingParams(temperature=0.0), None, 256, prefill)
    tokens, out = [*prompt, int(prefill.logits[-1].argmax())], []
    for _ in range(steps):
        draft = proposer.propose(tokens, 50)
        out.append(draft.tokens)
        verified = runtime.forward([tokens[-1], *draft.tokens], capture=proposer.target_layers)
        runtime.commit(range(1))
        proposer.feedback(0, verified)
        tokens.append(int(verified.logits[0].argmax()))
    return out


def test_export_reads_back_as_a_speculators_checkpoint_with_the_same_drafts(zoo, tmp_path):
    target = zoo.load("qwen3", "float32")
    make_dflash(target, tmp_path / "d", draft_vocab_size=100, aux_layers=[1, 3])
    export_for_vllm(tmp_path / "d", target, zoo.path("qwen3"), tmp_path / "v")
    ours, _ = load_dflash(tmp_path / "d", target)
    theirs, _ = load_dflash(tmp_path / "v", target)  # no specdec marker: ids read minus one
    assert theirs.config == ours.config and theirs.config.runtime_layers == (2, 4)
    for name, tensor in ours.state_dict().items():
        assert torch.equal(theirs.state_dict()[name], tensor), name
    prompt = [1, 40, 41, 42, 43, 44, 45]
    drafts = _drafts(target, tmp_path / "d", prompt, 4)
    assert drafts == _drafts(target, tmp_path / "v", prompt, 4) and all(len(d) == 7 for d in drafts)


def test_causal_foreign_checkpoint_is_refused(zoo, tmp_path):
    target = zoo.load("qwen3")
    make_dflash(target, tmp_path / "d")
    export_for_vllm(tmp_path / "d", target, zoo.path("qwen3"), tmp_path / "v")
    config, tensors = read(tmp_path / "v")
    config["transformer_layer_config"].pop("is_causal")
    config["sliding_window_non_causal"] = False  # what vLLM runs causal
    (tmp_path / "v" / "config.json").write_text(json.dumps(config))
    save_file(tensors, str(tmp_path / "v" / "model.safetensors"))
    with pytest.raises(ValueError, match="causally or over a sliding window"):
        load_dflash(tmp_path / "v", target)


@pytest.mark.parametrize("name", ["gemma-3-270m-dflash-b8", "gemma-3-270m-dflash-b16"])
def test_shipped_drafters_keep_their_layer_outputs(name):
    config = json.loads((SHIPPED / name / "config.json").read_text())
    assert AUX_MARKER in config["specdec"]
    assert aux_layer_outputs(config) == config["aux_hidden_state_layer_ids"] == [1, 8, 14]
