"""`train_log.jsonl`: one JSON line per optimizer step, appended as training goes."""

from __future__ import annotations

import json
import os
from pathlib import Path


def append_record(path: Path, record: dict) -> None:
    """Opened per line: a checkpoint replaces the output directory (atomic drafter write), so a handle
    kept open could point at the replaced directory's file."""
    with path.open("a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")


def truncate_log(path: Path, step: int) -> None:
    """Cuts the log after the line of `step`, in place: a resume repeats the steps after its checkpoint,
    so their lines from the interrupted run (and a line it left half-written) go."""
    if not path.is_file():
        return
    keep = 0
    with path.open("rb") as f:
        for line in f:
            logged = _step(line) if line.endswith(b"\n") else None
            if logged is None or logged > step:
                break
            keep += len(line)
    if keep < path.stat().st_size:
        os.truncate(path, keep)


def _step(line: bytes) -> int | None:
    try:
        return int(json.loads(line)["step"])
    except (ValueError, KeyError, TypeError):
        return None
