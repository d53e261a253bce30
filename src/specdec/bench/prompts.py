"""Benchmark prompts: reading the jsonl file and rendering every turn into prompt token ids.

Two line schemas are accepted (both may appear in one file):

* MT-Bench: ``{"question_id": 81, "category": "writing", "turns": ["...", "..."]}``
* plain: ``{"prompt": "...", "category": "..."}`` (category optional, default "uncategorized"; an optional
  ``question_id`` or ``id`` is kept, else the 1-based line number is used). A plain line is one turn.

Every turn is benchmarked as its own generation. Turn k's prompt contains the earlier turns and the
model's own earlier answers, taken from the *plain* run so that plain and speculative decoding always see
identical prompt tokens.

An MT-Bench line may also give the earlier answers: ``"answers": ["...", ...]`` with one string per turn but
the last (``len(turns) - 1``). Then the conversation is replayed with those answers and ONLY the last turn is
benchmarked (one generation per question), e.g. a recorded chat whose next user message is the prompt.
A given answer that does not start with whitespace gets a leading space, as the model's own answers have.

Rendering:

* With a chat template: ``tokenizer.apply_chat_template(messages, add_generation_prompt=True)`` over
  user/assistant messages.
* Without one: the first turn is ``Question: {turn}\\nAnswer:``; each later turn appends the previous answer
  and then ``\\nQuestion: {turn}\\nAnswer:``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_CATEGORY = "uncategorized"
FIRST_TURN = "Question: {turn}\nAnswer:"
NEXT_TURN = "\nQuestion: {turn}\nAnswer:"


@dataclass(frozen=True)
class Question:
    question_id: int | str
    category: str
    turns: tuple[str, ...]
    # Given answers to all turns but the last; then only the last turn is benchmarked. None: every turn is,
    # with the plain run's own earlier answers.
    answers: tuple[str, ...] | None = None

    def benchmarked_turns(self) -> range:
        """0-based indices of the turns that are benchmarked, each as its own generation."""
        if self.answers is not None:
            return range(len(self.turns) - 1, len(self.turns))
        return range(len(self.turns))


def first_prompt(tokenizer: Any, q: Question) -> list[int]:
    """Prompt ids of the question's first benchmarked turn (the only one when answers are given)."""
    if q.answers is not None:
        return render_prompt(tokenizer, q.turns, q.answers)
    return render_prompt(tokenizer, q.turns[:1], [])


def _parse_line(data: Any, lineno: int, path: Path) -> Question:
    where = f"{path}:{lineno}"
    if not isinstance(data, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(data).__name__}")
    if "turns" in data:
        turns = data["turns"]
        if not isinstance(turns, list) or not turns or not all(isinstance(t, str) and t for t in turns):
            raise ValueError(f"{where}: 'turns' must be a non-empty list of non-empty strings")
    elif "prompt" in data:
        if not isinstance(data["prompt"], str) or not data["prompt"]:
            raise ValueError(f"{where}: 'prompt' must be a non-empty string")
        turns = [data["prompt"]]
    else:
        raise ValueError(f"{where}: a line needs 'turns' (MT-Bench schema) or 'prompt'")
    category = data.get("category") or DEFAULT_CATEGORY
    if not isinstance(category, str):
        raise ValueError(f"{where}: 'category' must be a string")
    answers = data.get("answers")
    if answers is not None:
        if "turns" not in data:
            raise ValueError(f"{where}: 'answers' needs 'turns' (the answers are to the turns before the last)")
        if not isinstance(answers, list) or not all(isinstance(a, str) for a in answers):
            raise ValueError(f"{where}: 'answers' must be a list of strings")
        if len(answers) != len(turns) - 1:
            raise ValueError(f"{where}: 'answers' must have one string per turn but the last: {len(turns)} turns "
                             f"need {len(turns) - 1} answers, got {len(answers)}")
        # Written after "Answer:" like the model's own answers, which start with a space (chat templates strip it).
        answers = tuple(x if x[:1].isspace() else " " + x for x in answers)
    qid = data.get("question_id", data.get("id", lineno))
    return Question(question_id=qid, category=category, turns=tuple(turns), answers=answers)


def load_questions(
    path: str | Path, limit: int | None = None, categories: Sequence[str] | None = None,
    per_category: int | None = None,
) -> list[Question]:
    """Reads the jsonl file; keeps the given categories (in file order), then the first `per_category`
    questions of each category, then the first `limit` questions. MT-Bench's file is sorted by category
    (its first 10 questions are all `writing`), so `per_category` is how a short run still covers all 8."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"prompt file not found: {path}")
    questions = []
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                data = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{lineno}: not valid JSON: {exc}") from exc
            questions.append(_parse_line(data, lineno, path))
    if categories:
        wanted = set(categories)
        known = {q.category for q in questions}
        if not wanted & known:
            raise ValueError(f"no prompts in categories {sorted(wanted)}; the file has {sorted(known)}")
        questions = [q for q in questions if q.category in wanted]
    if per_category is not None:
        if per_category < 1:
            raise ValueError(f"--per-category must be >= 1, got {per_category}")
        taken: dict[str, int] = {}
        kept = []
        for q in questions:
            taken[q.category] = taken.get(q.category, 0) + 1
            if taken[q.category] <= per_category:
                kept.append(q)
        questions = kept
    if limit is not None:
        if limit < 1:
            raise ValueError(f"--limit must be >= 1, got {limit}")
        questions = questions[:limit]
    if not questions:
        raise ValueError(f"no prompts in {path}")
    return questions


def has_chat_template(tokenizer: Any) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def _ids(encoded: Any) -> list[int]:
    """apply_chat_template returns a list, a nested list or a BatchEncoding depending on the version."""
    if isinstance(encoded, Mapping) or hasattr(encoded, "input_ids"):
        encoded = encoded["input_ids"]
    if hasattr(encoded, "tolist"):
        encoded = encoded.tolist()
    if encoded and isinstance(encoded[0], list):
        (encoded,) = encoded
    return [int(t) for t in encoded]


def render_text(turns: Sequence[str], answers: Sequence[str]) -> str:
    """The no-chat-template prompt for turn len(turns), given the answers to the earlier turns."""
    if len(answers) != len(turns) - 1:
        raise ValueError(f"{len(turns)} turns need {len(turns) - 1} earlier answers, got {len(answers)}")
    text = FIRST_TURN.format(turn=turns[0])
    for answer, turn in zip(answers, turns[1:]):
        text += answer + NEXT_TURN.format(turn=turn)
    return text


def render_prompt(tokenizer: Any, turns: Sequence[str], answers: Sequence[str]) -> list[int]:
    """Prompt token ids for the last of `turns`, with `answers` to the earlier ones."""
    if has_chat_template(tokenizer):
        if len(answers) != len(turns) - 1:
            raise ValueError(f"{len(turns)} turns need {len(turns) - 1} earlier answers, got {len(answers)}")
        messages = []
        for i, turn in enumerate(turns):
            messages.append({"role": "user", "content": turn})
            if i < len(answers):
                messages.append({"role": "assistant", "content": answers[i].strip()})
        return _ids(tokenizer.apply_chat_template(messages, add_generation_prompt=True))
    return _ids(tokenizer(render_text(turns, answers)).input_ids)
