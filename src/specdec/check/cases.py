"""The case set `specdec check` runs: cases.jsonl.gz, shipped as package data.

Built once by scripts/make_check_cases.py from the training corpora (build_prompts, which skips every
held-out benchmark item and never reads ../shared/data/eval). A line is
`{"id": ..., "kind": ..., "turns": [...], "answers": [...]}`, `answers` (one per turn but the last) only
for a multi-turn case: the bench's prompt schema, so `first_prompt` renders it as `specdec bench` would.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from specdec.bench.prompts import Question

CASES_PATH = Path(__file__).with_name("cases.jsonl.gz")
LONG_KIND = "long_context"
KINDS = ("chat", "writing", "code", "math", "summarization", "translation", "qa", "rag", LONG_KIND)


@dataclass(frozen=True)
class CheckCase:
    id: str
    kind: str
    turns: tuple[str, ...]
    answers: tuple[str, ...] = ()

    def question(self) -> Question:
        """The case as a benchmark question: its last turn is the one generated."""
        return Question(self.id, self.kind, self.turns, self.answers if self.answers else None)


def load_cases(path: str | Path | None = None, limit: int | None = None,
               kinds: Sequence[str] | None = None) -> list[CheckCase]:
    """The shipped cases (or those of `path`, jsonl or jsonl.gz), those of `kinds` only, the first `limit`."""
    path = Path(path) if path is not None else CASES_PATH
    if not path.is_file():
        raise ValueError(f"case file not found: {path}")
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        cases = [_parse(line, n, path) for n, line in enumerate(f, 1) if line.strip()]
    if kinds:
        unknown = set(kinds) - {c.kind for c in cases}
        if unknown:
            raise ValueError(f"no cases of kind {sorted(unknown)}; the set has {sorted({c.kind for c in cases})}")
        cases = [c for c in cases if c.kind in kinds]
    if limit is not None:
        if limit < 1:
            raise ValueError(f"--limit must be >= 1, got {limit}")
        cases = cases[:limit]
    if not cases:
        raise ValueError(f"no cases in {path}")
    return cases


def _parse(line: str, lineno: int, path: Path) -> CheckCase:
    where = f"{path}:{lineno}"
    try:
        data = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{where}: not valid JSON: {exc}") from exc
    if not isinstance(data, dict) or not all(k in data for k in ("id", "kind", "turns")):
        raise ValueError(f"{where}: a case is an object with 'id', 'kind' and 'turns'")
    turns, answers = data["turns"], data.get("answers", [])
    if not isinstance(turns, list) or not turns or not all(isinstance(t, str) and t for t in turns):
        raise ValueError(f"{where}: 'turns' must be a non-empty list of non-empty strings")
    if not isinstance(answers, list) or not all(isinstance(a, str) for a in answers):
        raise ValueError(f"{where}: 'answers' must be a list of strings")
    if answers and len(answers) != len(turns) - 1:
        raise ValueError(f"{where}: {len(turns)} turns need {len(turns) - 1} answers, got {len(answers)}")
    return CheckCase(str(data["id"]), str(data["kind"]), tuple(turns), tuple(answers))
