"""A training's `--output` directory: the drafter plus its run's checkpoint, log and report. A new run
never writes into a directory that already holds something (a shipped drafter, another run) unless asked."""

from __future__ import annotations

from pathlib import Path

from specdec.atomic_write import restore_interrupted

STATE_FILE = "training_state.pt"
LOG_FILE = "train_log.jsonl"
REPORT_FILE = "training_report.json"


def check_output_dir(output: Path, resume: bool, overwrite: bool) -> None:
    """Raises unless `output` may take this run: `resume` needs the checkpoint of an earlier run there; a
    new run needs it missing or empty, or `overwrite`."""
    output = Path(output)
    if resume and overwrite:
        raise ValueError("--resume continues the run in --output and --overwrite replaces it: pass one of them")
    restore_interrupted(output)  # a crash mid drafter write may have left the directory aside
    if resume:
        if not (output / STATE_FILE).is_file():
            raise FileNotFoundError(f"--resume: no {STATE_FILE} in {output}")
        return
    if overwrite or not output.is_dir() or not any(output.iterdir()):
        return
    hint = ", --resume to continue its training" if (output / STATE_FILE).is_file() else ""
    raise FileExistsError(f"{output} is not empty (it holds a drafter or another training run): pass --overwrite to "
                          f"replace it{hint}, or choose another --output")


def clear_previous_run(output: Path) -> None:
    """An overwriting run starts afresh: the old run's checkpoint, log and report go (its drafter files stay
    until this run's first checkpoint replaces them atomically; other files, e.g. a model card, stay)."""
    for name in (STATE_FILE, LOG_FILE, REPORT_FILE):
        (Path(output) / name).unlink(missing_ok=True)
