"""Training and data hardening (items 14-18): checkpoints load without unpickling code, drafters and
checkpoints are written atomically and never over a non-empty --output by accident, a resumed run logs
each step once, the samples file is repaired in place, and the feature cache keeps targets apart."""

from __future__ import annotations

import builtins
import io
import json
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from specdec.atomic_write import replace_directory, restore_interrupted
from specdec.cli import main
from specdec.drafting import drafter_format
from specdec.drafting.drafter_format import save_drafter
from specdec.training import checkpoint as checkpoint_module
from specdec.training.features import FeatureExtractor
from specdec.training.self_distill import Sample, _repair_tail
from specdec.training.train_medusa import MedusaObjective, MedusaTrainOptions, train_medusa
from specdec.training.trainer import LOG_FILE, STATE_FILE, TrainSettings

from eagle3_helpers import write_data_dir

OPTIONS = MedusaTrainOptions(draft_vocab_size=64, num_heads=2)


def settings(max_steps: int) -> TrainSettings:
    # 32-token samples, 64 tokens a step: two samples per optimizer step
    return TrainSettings(max_steps=max_steps, tokens_per_step=64, warmup_steps=2, checkpoint_every=2,
                         val_fraction=0.0, lr=1e-3)


@pytest.fixture
def target(zoo, monkeypatch):
    # the draft vocabulary's fallback would read the training corpora: seconds, and irrelevant here
    monkeypatch.setattr("specdec.training.train_medusa._prompt_tokens", lambda target, samples: [])
    return zoo.load("bigram")


@pytest.fixture
def samples(target) -> list[Sample]:
    gen = torch.Generator().manual_seed(0)
    return [Sample(f"s{i}", "test", torch.randint(3, target.vocab_size, (8,), generator=gen).tolist(),
                   torch.randint(3, target.vocab_size, (24,), generator=gen).tolist()) for i in range(8)]


def logged_steps(output: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (output / LOG_FILE).read_text().splitlines()]


def weights(output: Path) -> dict[str, torch.Tensor]:
    return load_file(str(output / "model.safetensors"))


# --- item 14: no code runs when a checkpoint is loaded -------------------------------------------------------


class _RunsCode:
    """Unpickled, it would run `exec(source)`."""

    def __init__(self, source: str) -> None:
        self.source = source

    def __reduce__(self):
        return (exec, (self.source,))


def test_item14_resume_refuses_a_checkpoint_that_would_run_code(target, samples, tmp_path):
    """Item 14: a copied run directory whose training_state.pt carries a pickled object with a malicious
    __reduce__ is refused with a clear error, and the object's code never runs."""
    out, marker = tmp_path / "run", tmp_path / "pwned"
    train_medusa(target, samples, out, settings(2), OPTIONS, progress=False)
    state = torch.load(out / STATE_FILE, weights_only=True)
    state["progress"]["note"] = _RunsCode(f"open({str(marker)!r}, 'w').write('ran')")
    torch.save(state, out / STATE_FILE)
    with pytest.raises(ValueError, match="could run code"):
        train_medusa(target, samples, out, settings(4), OPTIONS, resume=True, progress=False)
    assert not marker.exists()


def test_item14_resume_still_matches_an_uninterrupted_run(target, samples, tmp_path):
    """Item 14 (regression guard: passed before the fix too): the checkpoint still loads with
    weights_only=True, and 2 steps + resume to 4 gives bit for bit the weights of 4 steps in one go."""
    train_medusa(target, samples, tmp_path / "whole", settings(4), OPTIONS, progress=False)
    train_medusa(target, samples, tmp_path / "split", settings(2), OPTIONS, progress=False)
    torch.load(tmp_path / "split" / STATE_FILE, weights_only=True)
    report = train_medusa(target, samples, tmp_path / "split", settings(4), OPTIONS, resume=True, progress=False)
    assert report["steps"] == 4
    whole, split = weights(tmp_path / "whole"), weights(tmp_path / "split")
    assert whole.keys() == split.keys()
    assert all(torch.equal(whole[k], split[k]) for k in whole)


# --- item 15: --overwrite, atomic drafter and checkpoint writes ------------------------------------------------


def fake_drafter(folder: Path) -> dict[str, bytes]:
    folder.mkdir(parents=True)
    save_drafter(folder, {"speculators_model_type": "medusa", "old": True}, {"w": torch.ones(4)})
    (folder / "README.md").write_text("model card\n")
    return {p.name: p.read_bytes() for p in folder.iterdir()}


def test_item15_training_refuses_a_non_empty_output_unless_overwrite(target, samples, tmp_path):
    """Item 15: training into a directory that holds a drafter fails, naming it and --overwrite, and leaves
    it untouched; with overwrite it is replaced (the model card beside it stays)."""
    out = tmp_path / "shipped"
    before = fake_drafter(out)
    with pytest.raises(FileExistsError, match="--overwrite") as error:
        train_medusa(target, samples, out, settings(2), OPTIONS, progress=False)
    assert str(out) in str(error.value)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    train_medusa(target, samples, out, settings(2), OPTIONS, progress=False, overwrite=True)
    config = json.loads((out / "config.json").read_text())
    assert "old" not in config and config["speculators_model_type"] == "medusa"
    assert (out / "README.md").read_text() == "model card\n" and logged_steps(out) == [1, 2]


def test_item15_cli_overwrite_flag(zoo, target, samples, tmp_path, capsys):
    """Item 15: `specdec train medusa --output <non-empty>` is one clear error; `--overwrite` trains."""
    data = write_data_dir(tmp_path / "data", samples)
    out = tmp_path / "drafters" / "gemma-3-270m-medusa"
    before = fake_drafter(out)
    argv = ["train", "medusa", "--target", zoo.path("bigram"), "--data", str(data), "--output", str(out),
            "--max-steps", "2", "--tokens-per-step", "64", "--checkpoint-every", "2", "--val-fraction", "0",
            "--draft-vocab-size", "64", "--num-heads", "2"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert str(out) in err and "--overwrite" in err and len(err.strip().splitlines()) == 1
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert main([*argv, "--overwrite"]) == 0
    assert json.loads(capsys.readouterr().out)["steps"] == 2
    assert main([*argv, "--max-steps", "4", "--resume"]) == 0  # resuming the same output needs no flag
    assert logged_steps(out) == [1, 2, 3, 4]


def test_item15_save_drafter_crash_keeps_the_old_drafter(tmp_path, monkeypatch):
    """Item 15: a crash while the weights are written leaves the old drafter complete (not new weights
    half-written in place) and no temporary folder that looks like a drafter."""
    out = tmp_path / "d"
    before = fake_drafter(out)

    def crash(tensors, path, *args, **kwargs):
        Path(path).write_bytes(b"partial")
        raise KeyboardInterrupt

    monkeypatch.setattr(drafter_format, "save_file", crash)
    with pytest.raises(KeyboardInterrupt):
        save_drafter(out, {"speculators_model_type": "medusa", "new": True}, {"w": torch.zeros(4)})
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert [p.name for p in tmp_path.iterdir()] == ["d"]


def test_item15_swap_interrupted_between_renames_is_restored(tmp_path):
    """Item 15: a crash after the old drafter was renamed aside but before the new one came in leaves the
    old one complete beside the missing directory; the next write (or resume check) puts it back."""
    out = tmp_path / "d"
    before = fake_drafter(out)
    os.rename(out, tmp_path / ".d.old-123-abcd")  # where replace_directory moves the old one aside
    restore_interrupted(out)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    (out / ".training_state.pt.tmp-99-0123abcd").write_bytes(b"left by a killed checkpoint write")
    replace_directory(out, lambda folder: (folder / "config.json").write_text("{}"))
    assert (out / "config.json").read_text() == "{}" and (out / "README.md").is_file()
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "config.json", "model.safetensors"]
    assert [p.name for p in tmp_path.iterdir()] == ["d"]


def test_item15_checkpoint_and_drafter_are_flushed_before_they_replace_the_old(tmp_path, monkeypatch):
    """Item 15: the new checkpoint file and the new drafter folder reach the disk (fsync) before the rename
    that replaces the old ones, else a power loss could leave a renamed but empty file."""
    events: list[tuple[str, str]] = []
    real_fsync, real_replace, real_rename = os.fsync, os.replace, os.rename

    def fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", lambda a, b: (events.append(("rename", str(a))), real_replace(a, b))[1])
    monkeypatch.setattr(os, "rename", lambda a, b: (events.append(("rename", str(a))), real_rename(a, b))[1])
    state_path = tmp_path / STATE_FILE
    checkpoint_module.save_checkpoint(state_path, {"step": torch.tensor(1)})
    save_drafter(tmp_path / "d", {"speculators_model_type": "medusa"}, {"w": torch.ones(2)})
    renamed = [path for kind, path in events if kind == "rename"]
    assert len(renamed) == 2
    for moved in renamed:
        synced = [i for i, (kind, path) in enumerate(events) if kind == "fsync" and path.startswith(moved)]
        assert synced and max(synced) < events.index(("rename", moved)), (moved, events)
    assert torch.load(state_path, weights_only=True) == {"step": torch.tensor(1)}


# --- item 16: one log line per step after a resume --------------------------------------------------------------


def test_item16_resumed_run_logs_every_step_once(target, samples, tmp_path, monkeypatch):
    """Item 16: a run killed after step 3 (last checkpoint at step 2, a half-written line at the end)
    and then resumed has each of the steps 1-4 exactly once in train_log.jsonl."""
    out = tmp_path / "run"
    real_loss, calls = MedusaObjective.loss, []

    def crashing_loss(self, sample):
        calls.append(1)
        if len(calls) == 7:  # the first sample of step 4: steps 1-3 are logged, step 2 is the checkpoint
            raise KeyboardInterrupt
        return real_loss(self, sample)

    monkeypatch.setattr(MedusaObjective, "loss", crashing_loss)
    with pytest.raises(KeyboardInterrupt):
        train_medusa(target, samples, out, settings(4), OPTIONS, progress=False)
    monkeypatch.setattr(MedusaObjective, "loss", real_loss)
    assert logged_steps(out) == [1, 2, 3]
    with (out / LOG_FILE).open("a") as f:
        f.write('{"step": 4, "lo')  # killed mid-line
    report = train_medusa(target, samples, out, settings(4), OPTIONS, resume=True, progress=False)
    assert report["steps"] == 4 and logged_steps(out) == [1, 2, 3, 4]


# --- item 17: samples.jsonl repaired in place ------------------------------------------------------------------


def test_item17_repair_tail_truncates_without_rewriting(tmp_path, monkeypatch):
    """Item 17: a partial last line is cut with a truncate; the file is never opened for writing from
    scratch ('w' mode) nor replaced (same inode), so a crash during the repair cannot lose the data set."""
    path = tmp_path / "samples.jsonl"
    complete = "".join(json.dumps({"id": f"p{i}", "kind": "qa", "prompt_ids": [1, 2],
                                   "response_ids": [3] * 5000}) + "\n" for i in range(30))
    path.write_text(complete + '{"id": "p30", "kind": "qa", "prompt_ids": [' + "1, " * 40_000)  # > one read chunk
    inode = path.stat().st_ino
    real_open = builtins.open

    def guarded_open(file, mode="r", *args, **kwargs):
        if "w" in mode:
            raise AssertionError(f"{file} opened with mode {mode!r}: a rewrite")
        return real_open(file, mode, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", guarded_open)
    monkeypatch.setattr(io, "open", guarded_open)
    _repair_tail(path)
    monkeypatch.undo()
    assert path.read_text() == complete and path.stat().st_ino == inode
    path.write_text('{"id": "p0", "ki')  # no complete line at all
    _repair_tail(path)
    assert path.read_bytes() == b""
    path.write_text(complete)  # nothing to repair
    _repair_tail(path)
    assert path.read_text() == complete


# --- item 18: the feature cache keeps targets and dtypes apart -------------------------------------------------


@pytest.mark.parametrize("other", [("llama_draft", "bfloat16"), ("bigram", "float32")],
                         ids=["other-weights", "other-dtype"])
def test_item18_feature_cache_is_not_shared_between_targets(zoo, tmp_path, other):
    """Item 18: two targets of one shape but other weights (or one target in another dtype) sharing a
    cache directory each get their own features, not the other's cached ones."""
    cache = tmp_path / "cache"
    first, second = zoo.load("bigram"), zoo.load(*other)
    ids = list(range(3, 40))
    cached = FeatureExtractor(first, [1, 2], cache).get(ids)
    extractor = FeatureExtractor(second, [1, 2], cache)
    got, want = extractor.get(ids), extractor.compute(ids)
    assert got.final_hidden.dtype == want.final_hidden.dtype
    assert torch.equal(got.final_hidden, want.final_hidden) and not torch.equal(
        got.final_hidden.float(), cached.final_hidden.float())
    assert len(list(cache.glob("*.safetensors"))) == 2
    again = FeatureExtractor(first, [1, 2], cache)  # the same target still finds its own entry
    assert torch.equal(again.get(ids).final_hidden, cached.final_hidden)
