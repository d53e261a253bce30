"""`specdec drafter info`: a shipped drafter's method, target, sizes, stored settings and the figures behind
them; the JSON form; bad input as one clear error line."""

from __future__ import annotations

import json

import pytest
import torch

from specdec.cli import main
from specdec.drafting.shipped import ENV_VAR, shipped_drafters_dir
from specdec.models import fast_linear


@pytest.fixture(autouse=True)
def _no_env(monkeypatch):
    monkeypatch.delenv(ENV_VAR, raising=False)


def test_info_on_the_shipped_eagle3(capsys, monkeypatch):
    monkeypatch.setattr(fast_linear, "kernel_isa", lambda: "avx2")  # the stored default there: the chain
    assert main(["drafter", "info", "gemma-3-270m-eagle3"]) == 0
    out = capsys.readouterr().out
    for text in ("method: eagle3 (Eagle3Speculator)", "target: gemma-3-270m (vocabulary 262144",
                 "draft layers 1", "draft vocabulary 8192", "M parameters stored",
                 "num_speculative_tokens=7, confidence_threshold=0.45", "2.2337x", "3.9765", "32/32",
                 "defaults/eagle3", "2026-12-05", "benchmarks/results/defaults/eagle3-mt_bench.json", "chosen: greedy",
                 '"num_speculative_tokens": 7'):
        assert text in out, text


def test_info_gives_the_default_of_the_kernels_built_here(capsys, monkeypatch):
    monkeypatch.setattr(fast_linear, "kernel_isa", lambda: "amx")  # the stored default there: the tree
    assert main(["drafter", "info", "gemma-3-270m-eagle3", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["default_proposal_method"] == "dynamic_tree"
    assert [m["proposal_type"] for m in info["proposal_methods"] if m["default"]] == ["dynamic_tree"]
    assert info["effective_config"]["tree_top_k"] == 3 and info["effective_config"]["num_speculative_tokens"] == 10


def test_info_gives_the_sweep_a_drafter_was_tuned_on(capsys):
    assert main(["drafter", "info", "gemma-3-270m-dflash-b16"]) == 0
    out = capsys.readouterr().out
    for text in ("chosen: greedy", "num_speculative_tokens=5", "1.2839x", "tune-1", "0.9489x", "all-methods-2"):
        assert text in out, text


def test_info_says_when_a_drafter_is_not_tuned(tmp_path, capsys):
    shipped = shipped_drafters_dir() / "gemma-3-270m-dflash-b16"
    config = json.loads((shipped / "config.json").read_text())
    config["specdec_tuning"].update(chosen=None, needed="not tuned: sweep K 3-15", candidates=[])
    untuned = tmp_path / "untuned"
    untuned.mkdir()
    (untuned / "config.json").write_text(json.dumps(config))
    (untuned / "model.safetensors").symlink_to(shipped / "model.safetensors")
    assert main(["drafter", "info", str(untuned)]) == 0
    out = capsys.readouterr().out
    assert "chosen: none (not tuned)" in out and "needed: not tuned" in out


def test_info_names_the_entry_a_kernel_default_picks_among_two_of_one_type(capsys, monkeypatch):
    monkeypatch.setattr(fast_linear, "kernel_isa", lambda: "amx")  # Medusa's stored default there: a fixed depth
    assert main(["drafter", "info", "gemma-3-270m-medusa", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert [m.get("name") for m in info["proposal_methods"] if m["default"]] == ["dynamic_tree_fixed_depth"]
    assert info["effective_config"]["num_speculative_tokens"] == 4 and info["effective_config"]["tree_top_k"] == 4
    monkeypatch.setattr(fast_linear, "kernel_isa", lambda: "avx2")
    assert main(["drafter", "info", "gemma-3-270m-medusa"]) == 0
    out = capsys.readouterr().out
    assert "dynamic_tree (dynamic_tree_fixed_depth)" in out and '"num_speculative_tokens": "auto"' in out


def test_info_as_json(capsys, monkeypatch):
    monkeypatch.setattr(fast_linear, "kernel_isa", lambda: "avx2")  # the stored default there: "auto"
    assert main(["drafter", "info", "gemma-3-270m-mtp", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["method"] == "mtp" and info["sizes"]["MTP modules"] == 1
    assert info["default_proposal_method"] == "greedy"
    assert info["effective_config"]["num_speculative_tokens"] == "auto"  # stored: "auto", at most 6
    assert info["effective_config"]["max_num_speculative_tokens"] == 6
    assert info["effective_config"]["confidence_threshold"] == 0.4
    assert info["tuning"]["candidates"][0]["speedup"] == 1.9903
    assert info["weights"]["parameters"] > 0


def test_info_on_a_drafter_without_stored_figures(tmp_path, capsys):
    spec = {"proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}],
            "default_proposal_method": "greedy", "verifier": {"name_or_path": "tiny"}}
    (tmp_path / "config.json").write_text(json.dumps({"speculators_model_type": "eagle3",
                                                      "speculators_config": spec}))
    assert main(["drafter", "info", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "num_speculative_tokens=3" in out and "no measured figures stored" in out


@pytest.mark.parametrize("content, message", [
    (None, "is not a drafter directory (no config.json)"),
    ("{oops", "is not valid JSON"),
    ('{"model_type": "llama"}', "is not a speculators drafter config"),
])
def test_bad_drafter_directories(tmp_path, capsys, content, message):
    if content is not None:
        (tmp_path / "config.json").write_text(content)
    assert main(["drafter", "info", str(tmp_path)]) == 2
    assert message in capsys.readouterr().err


def test_unknown_name_lists_the_shipped_drafters(capsys):
    assert main(["drafter", "info", "no-such-drafter"]) == 2
    err = capsys.readouterr().err
    assert "drafter not found" in err and "gemma-3-270m-eagle3" in err


def test_a_target_on_a_gpu_takes_the_portable_default(monkeypatch):
    """The kernel build's default speaks of CPU rows: a bare config for a target on cuda takes
    default_proposal_method (EAGLE-3's chain) even where this CPU has the AMX kernels (its tree); on the
    CPU, or with the device left to the loader on a machine without cuda, the AMX entry."""
    from specdec.speculative_config import SpeculativeConfig

    monkeypatch.setattr(fast_linear, "kernel_isa", lambda: "amx")
    bare = {"method": "eagle3", "model": "gemma-3-270m-eagle3"}
    on_gpu = SpeculativeConfig.from_dict(bare, None, "cuda")
    on_cpu = SpeculativeConfig.from_dict(bare, None, "cpu")
    assert on_gpu.options.tree_top_k == 1 and on_gpu.options.num_speculative_tokens == 7
    assert on_cpu.options.tree_top_k == 3 and on_cpu.options.num_speculative_tokens == 10
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert SpeculativeConfig.from_dict(bare).options.tree_top_k == 3
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert SpeculativeConfig.from_dict(bare).options.tree_top_k == 1
    assert SpeculativeConfig.from_value(json.dumps(bare), None, "cuda:0").options.tree_top_k == 1
