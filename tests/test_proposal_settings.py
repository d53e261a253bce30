"""A drafter's stored best settings (speculators `proposal_methods`, drafting/proposal_settings.py): which keys
`{"method": ..., "model": ...}` takes from the drafter, what the user's keys override, and that every figure
the shipped drafters store is the one in the bench report they name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specdec import SpeculativeConfig
from specdec.models import fast_linear
from specdec.drafting.proposal_settings import entry_options
from specdec.drafting.shipped import ENV_VAR, shipped_drafter_names, shipped_drafters_dir

ROOT = Path(__file__).resolve().parents[1]
EAGLE = "gemma-3-270m-eagle3"
HELD_OUT = "other_kinds"  # the bench's held-out kinds: never the set settings are chosen on


@pytest.fixture(autouse=True)
def _no_env(monkeypatch):
    monkeypatch.delenv(ENV_VAR, raising=False)
    # the stored default may depend on the kernels built here (specdec_default_proposal_method_by_kernels):
    # these tests expect the portable one unless they set another
    monkeypatch.setattr(fast_linear, "kernel_isa", lambda: "avx2")


def _drafter(tmp_path: Path, method: str, proposal_methods: list, default: str | None = "greedy") -> str:
    directory = tmp_path / f"my-{method}"
    directory.mkdir()
    spec = {"algorithm": method, "proposal_methods": proposal_methods, "default_proposal_method": default}
    (directory / "config.json").write_text(json.dumps({"speculators_model_type": method, "speculators_config": spec}))
    return str(directory)


def _resolve(**config) -> dict:
    return SpeculativeConfig.from_dict(config).to_dict()


def test_the_shipped_eagle3_runs_its_stored_best_chain():
    config = SpeculativeConfig.from_dict({"method": "eagle3", "model": EAGLE})
    assert config.options.num_speculative_tokens == 7 and config.options.confidence_threshold == 0.45
    assert config.options.tree_top_k == 1
    assert config.from_drafter == ("confidence_threshold", "num_speculative_tokens")
    assert SpeculativeConfig.from_dict(config.to_dict()) == config  # the resolved config round-trips


def test_a_key_the_user_gives_wins_and_the_rest_stay_stored():
    out = _resolve(method="eagle3", model=EAGLE, num_speculative_tokens=4)
    assert out["num_speculative_tokens"] == 4 and out["confidence_threshold"] == 0.45
    out = _resolve(method="eagle3", model=EAGLE, num_speculative_tokens=4, confidence_threshold=0.0)
    assert out["num_speculative_tokens"] == 4 and out["confidence_threshold"] == 0.0
    assert SpeculativeConfig.from_dict({"method": "eagle3", "model": EAGLE, "num_speculative_tokens": 4,
                                        "confidence_threshold": 0.0}).from_drafter == ()


def test_asking_for_a_tree_takes_the_stored_tree():
    out = _resolve(method="eagle3", model=EAGLE, tree_top_k=3)
    assert (out["num_speculative_tokens"], out["tree_top_k"], out["tree_num_draft_tokens"],
            out["confidence_threshold"]) == (10, 3, 15, 0.1)
    out = _resolve(method="eagle3", model=EAGLE, tree_top_k=1)  # a chain, asked for explicitly
    assert out["num_speculative_tokens"] == 7 and out["confidence_threshold"] == 0.45


@pytest.mark.parametrize("isa, tree", [("amx", True), ("avx512_bf16", False), ("avx2", False), (None, False)])
def test_the_default_entry_follows_the_kernels_built_here(monkeypatch, isa, tree):
    """The shipped EAGLE-3's bare config runs its tree where the bf16 kernels are the AMX build (16
    verification rows cost about one there), its chain elsewhere; a shape the user asks for still wins, and a
    config with a key of its own keeps the chain's other settings everywhere."""
    monkeypatch.setattr(fast_linear, "kernel_isa", lambda: isa)
    out = _resolve(method="eagle3", model=EAGLE)
    assert (out["num_speculative_tokens"], out["tree_top_k"]) == ((10, 3) if tree else (7, 1))
    assert out["confidence_threshold"] == (0.1 if tree else 0.45)
    out = _resolve(method="eagle3", model=EAGLE, tree_top_k=1)  # a chain, asked for
    assert (out["num_speculative_tokens"], out["confidence_threshold"]) == (7, 0.45)
    # a key of the user's own: the portable default's shape fills the rest on every machine
    out = _resolve(method="eagle3", model=EAGLE, confidence_threshold=0.3)
    assert (out["num_speculative_tokens"], out["tree_top_k"], out["confidence_threshold"]) == (7, 1, 0.3)
    # `quantization` says how the drafter's weights run, not the draft's shape: the config stays bare
    out = _resolve(method="eagle3", model=EAGLE, quantization="none")
    assert (out["num_speculative_tokens"], out["tree_top_k"], out["quantization"]) == ((10, 3, "none") if tree
                                                                                      else (7, 1, "none"))


def test_a_kernel_build_missing_from_the_map_takes_the_stored_default(monkeypatch, tmp_path):
    monkeypatch.setattr(fast_linear, "kernel_isa", lambda: "amx")
    model = _drafter(tmp_path, "eagle3", [{"proposal_type": "greedy", "speculative_tokens": 5}])
    config = json.loads((Path(model) / "config.json").read_text())
    config["speculators_config"]["specdec_default_proposal_method_by_kernels"] = {"avx2": "dynamic_tree"}
    (Path(model) / "config.json").write_text(json.dumps(config))
    assert _resolve(method="eagle3", model=model)["num_speculative_tokens"] == 5  # amx: the default, greedy


def test_a_kernel_default_may_name_one_of_two_entries_of_a_proposal_type(monkeypatch, tmp_path):
    auto = {"proposal_type": "greedy", "speculative_tokens": 7,
            "specdec_options": {"num_speculative_tokens": "auto", "max_num_speculative_tokens": 7}}
    fixed = {"proposal_type": "greedy", "speculative_tokens": 7, "specdec_name": "fixed",
             "specdec_options": {"num_speculative_tokens": 7}}
    model = _drafter(tmp_path, "dflash", [auto, fixed])
    config = json.loads((Path(model) / "config.json").read_text())
    config["speculators_config"]["specdec_default_proposal_method_by_kernels"] = {"amx": "fixed"}
    (Path(model) / "config.json").write_text(json.dumps(config))
    assert SpeculativeConfig.from_dict({"method": "dflash", "model": model}).auto  # avx2: the first greedy
    monkeypatch.setattr(fast_linear, "kernel_isa", lambda: "amx")
    bare = SpeculativeConfig.from_dict({"method": "dflash", "model": model})
    assert not bare.auto and bare.num_speculative_tokens == 7  # amx: the named entry
    # a key of the user's own: the stored default (the first greedy) fills the rest, as on every machine
    assert SpeculativeConfig.from_dict({"method": "dflash", "model": model, "confidence_threshold": 0.2}).auto


def test_a_quantized_target_takes_the_portable_default(monkeypatch):
    # its kernels' verification rows cost more than bf16's AMX ones: the AMX defaults' fixed trees lost there
    monkeypatch.setattr(fast_linear, "kernel_isa", lambda: "amx")
    medusa = {"method": "medusa", "model": "gemma-3-270m-medusa"}
    assert not SpeculativeConfig.from_dict(medusa).auto  # bf16 on AMX: the fixed depth
    assert not SpeculativeConfig.from_dict(medusa, "none").auto
    for quantization in ("int8", "int4", "gguf"):
        assert SpeculativeConfig.from_dict(medusa, quantization).auto
        assert SpeculativeConfig.from_json(json.dumps(medusa), quantization=quantization).auto
        assert SpeculativeConfig.from_value(medusa, quantization).auto
    eagle = SpeculativeConfig.from_dict({"method": "eagle3", "model": EAGLE}, "gguf")
    assert eagle.options.tree_top_k == 1 and eagle.options.num_speculative_tokens == 7  # the stored chain


def test_w8a8_on_amx_int8_takes_the_dense_targets_default(monkeypatch):
    """w8a8_int8's rows cost about one row on the AMX-INT8 build, as bf16's on AMX: it takes the entry the
    kernels name (the fixed depth for Medusa); on another quantized build the portable one."""
    from specdec.quantization import kernel as quant_kernel

    monkeypatch.setattr(fast_linear, "kernel_isa", lambda: "amx")
    medusa = {"method": "medusa", "model": "gemma-3-270m-medusa"}
    monkeypatch.setattr(quant_kernel, "quant_kernel_isa", lambda: "amx_int8")
    assert not SpeculativeConfig.from_dict(medusa, "w8a8_int8").auto
    assert SpeculativeConfig.from_dict(medusa, "int8").auto
    monkeypatch.setattr(quant_kernel, "quant_kernel_isa", lambda: "avx512_vnni")
    assert SpeculativeConfig.from_dict(medusa, "w8a8_int8").auto


def test_auto_takes_the_stored_length_as_its_cap():
    out = _resolve(method="eagle3", model=EAGLE, num_speculative_tokens="auto")
    assert out["num_speculative_tokens"] == "auto" and out["max_num_speculative_tokens"] == 7
    out = _resolve(method="eagle3", model=EAGLE, num_speculative_tokens="auto", max_num_speculative_tokens=3)
    assert out["max_num_speculative_tokens"] == 3 and out["confidence_threshold"] == 0.45


def test_a_stored_auto_runs_auto_with_its_stored_cap_unless_the_user_fixes_a_length(tmp_path):
    auto = {"proposal_type": "greedy", "speculative_tokens": 5,
            "specdec_options": {"num_speculative_tokens": "auto", "max_num_speculative_tokens": 5,
                                "confidence_threshold": 0.3}}
    drafter = _drafter(tmp_path, "dflash", [auto])
    config = SpeculativeConfig.from_dict({"method": "dflash", "model": drafter})
    assert config.auto and config.num_speculative_tokens == 5 and config.options.confidence_threshold == 0.3
    assert _resolve(method="dflash", model=drafter, num_speculative_tokens="auto")["max_num_speculative_tokens"] == 5
    out = _resolve(method="dflash", model=drafter, num_speculative_tokens="auto", max_num_speculative_tokens=2)
    assert out["max_num_speculative_tokens"] == 2
    fixed = SpeculativeConfig.from_dict({"method": "dflash", "model": drafter, "num_speculative_tokens": 3})
    assert not fixed.auto and fixed.num_speculative_tokens == 3 and fixed.options.confidence_threshold == 0.3
    by_size = SpeculativeConfig.from_dict({"method": "dflash", "model": drafter,
                                           "num_speculative_tokens_by_batch_size": [[1, 4, 2]]})
    assert not by_size.auto and by_size.by_batch_size == ((1, 4, 2),)
    # the shipped drafters whose every fixed length can lose on some CPUs store "auto"
    assert SpeculativeConfig.from_dict({"method": "medusa", "model": "gemma-3-270m-medusa"}).auto
    assert not SpeculativeConfig.from_dict({"method": "medusa", "model": "gemma-3-270m-medusa",
                                            "tree_top_k": None}).auto  # another shape: no stored entry


def test_medusa_fixed_choices_are_not_mixed_with_a_stored_grown_tree():
    assert _resolve(method="medusa", model="gemma-3-270m-medusa")["tree_top_k"] == 4
    out = _resolve(method="medusa", model="gemma-3-270m-medusa", medusa_choices=[[0], [1], [0, 0]])
    assert out["tree_top_k"] is None and out["tree_num_draft_tokens"] == 24  # the method's own defaults
    out = _resolve(method="medusa", model="gemma-3-270m-medusa", tree_top_k=None)  # the static tree
    assert out["tree_top_k"] is None and out["tree_num_draft_tokens"] == 24


def test_hybrid_fallback_keeps_the_users_keys():
    fallback = {"method": "eagle3", "model": EAGLE, "num_speculative_tokens": 6, "confidence_threshold": 0.6}
    assert SpeculativeConfig.from_dict(fallback).to_dict() == {**fallback, "tree_top_k": 1,
                                                               "tree_num_draft_tokens": 16, "context_vocab": True,
                                                               "quantization": "auto"}


def test_no_stored_settings_for_other_models():
    assert SpeculativeConfig.from_dict({"method": "draft_model", "model": "self:4"}).from_drafter == ()
    assert SpeculativeConfig.from_dict({"method": "mtp"}).from_drafter == ()  # the checkpoint's own layers
    # a drafter of another method, or a name that is no drafter: loading it reports that, not the config
    assert SpeculativeConfig.from_dict({"method": "mtp", "model": EAGLE}).from_drafter == ()
    assert SpeculativeConfig.from_dict({"method": "eagle3", "model": "no-such-drafter"}).from_drafter == ()


def test_settings_derived_from_speculators_fields_alone(tmp_path):
    chain = _drafter(tmp_path, "eagle3", [{"proposal_type": "greedy", "speculative_tokens": 3}])
    assert _resolve(method="eagle3", model=chain)["num_speculative_tokens"] == 3
    tree = {"proposal_type": "dynamic_tree", "speculative_tokens": 12, "expansion_factor": 4, "depth": 5}
    assert entry_options(tree) == {"num_speculative_tokens": 5, "tree_top_k": 4, "tree_num_draft_tokens": 12}
    grown = _drafter(tmp_path, "mtp", [{"proposal_type": "greedy", "speculative_tokens": 2}, tree], "dynamic_tree")
    out = _resolve(method="mtp", model=grown)
    assert (out["num_speculative_tokens"], out["tree_top_k"], out["tree_num_draft_tokens"]) == (5, 4, 12)
    assert _resolve(method="mtp", model=grown, tree_top_k=1)["num_speculative_tokens"] == 2
    static = _drafter(tmp_path, "dflash", [{"proposal_type": "static_tree", "depth": 3}], "static_tree")
    assert SpeculativeConfig.from_dict({"method": "dflash", "model": static}).from_drafter == ()


def test_bad_stored_settings_name_the_drafter(tmp_path):
    unknown = _drafter(tmp_path, "eagle3", [{"proposal_type": "greedy", "specdec_options": {"beam_width": 2}}])
    with pytest.raises(ValueError, match=r"config\.json: stored proposal settings 'greedy' .*beam_width"):
        SpeculativeConfig.from_dict({"method": "eagle3", "model": unknown})
    too_long = {"proposal_type": "greedy", "specdec_options": {"num_speculative_tokens": 99}}
    wrong = _drafter(tmp_path, "dflash", [too_long])
    with pytest.raises(ValueError, match=r"num_speculative_tokens must be in 1\.\.63, got 99 \(with the settings "
                                         r"stored in .*config\.json"):
        SpeculativeConfig.from_dict({"method": "dflash", "model": wrong})
    # the user's own mistake is reported as theirs, without the stored settings
    with pytest.raises(ValueError, match=r"unknown key 'bogus'") as err:
        SpeculativeConfig.from_dict({"method": "eagle3", "model": EAGLE, "bogus": 1})
    assert "stored" not in str(err.value)


def _matching_run(candidate: dict, drafter: str) -> dict | None:
    report = json.loads((ROOT / candidate["report"]).read_text())
    for run in report.get("runs", [report]):
        cfg = run["speculative_config"]
        same = all(cfg.get(k) == v for k, v in candidate["settings"].items())
        if (Path(str(cfg.get("model"))).name == drafter and same
                and run["overall"]["speedup"] == candidate["speedup"]
                and run["overall"]["mean_acceptance_length"] == candidate["mean_acceptance_length"]):
            return run
    return None


def _name(entry_or_candidate: dict) -> str | None:
    return entry_or_candidate.get("specdec_name", entry_or_candidate.get("proposal_type"))


@pytest.mark.parametrize("name", shipped_drafter_names())
def test_every_stored_figure_is_in_the_report_it_names(name):
    config = json.loads((shipped_drafters_dir() / name / "config.json").read_text())
    tuning = config["specdec_tuning"]
    assert tuning["candidates"], "a drafter without measured figures says which sweep is needed"
    for candidate in tuning["candidates"]:
        assert HELD_OUT not in candidate["report"] and "mt_bench" in candidate["report"]
        run = _matching_run(candidate, name)
        assert run is not None, f"{name}: {candidate} is not in {candidate['report']}"
        n = run["overall"]["prompts"]
        assert candidate["identical"] == f"{run['overall']['identical']}/{n}"
    entries = config["speculators_config"]["proposal_methods"]
    if tuning["chosen"] is None:
        assert tuning["needed"]
        return
    # an entry (and the candidate it was chosen from) goes by its specdec_name where two share a proposal type
    chosen = [c for c in tuning["candidates"] if _name(c) == tuning["chosen"]]
    assert len(chosen) == 1 and config["speculators_config"]["default_proposal_method"] == tuning["chosen"]
    stored = {_name(e): entry_options(e) for e in entries}
    assert len(stored) == len(entries) and stored[tuning["chosen"]] == chosen[0]["settings"]
    same_run = [c for c in tuning["candidates"] if c["run"] == chosen[0]["run"]]
    assert chosen[0]["speedup"] == max(c["speedup"] for c in same_run)  # the best of its run
    # a default for a kernel build: stored as tuned, and the best of the run it was measured in
    by_kernels = config["speculators_config"].get("specdec_default_proposal_method_by_kernels", {})
    assert by_kernels == tuning.get("chosen_by_kernels", {})
    for proposal_type in by_kernels.values():
        picked = [c for c in tuning["candidates"] if _name(c) == proposal_type]
        assert len(picked) == 1 and stored[proposal_type] == picked[0]["settings"]
        same_run = [c for c in tuning["candidates"] if c["run"] == picked[0]["run"]]
        assert picked[0]["speedup"] == max(c["speedup"] for c in same_run)
