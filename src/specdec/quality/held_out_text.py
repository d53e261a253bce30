"""Held-out text for quality measurements: the WikiText-2 articles the benchmark prompts use, which every
drafter-training data builder skips (benchmarks/prompts/*.exclude.json)."""

from __future__ import annotations

import json
from pathlib import Path

from specdec.training.prompt_sources import DEFAULT_DATA_DIR, DEFAULT_EXCLUDE, UNK_BLANK, Exclusions


def held_out_articles(data_dir: str | Path | None = None, limit: int | None = None) -> list[dict[str, str]]:
    """[{"id", "title", "text"}] of the held-out WikiText-2 articles, <unk> shown as a blank (as the prompts
    show it), in file order."""
    path = Path(data_dir or DEFAULT_DATA_DIR) / "wikitext2" / "articles.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found (pass --data-dir: the folder holding wikitext2/articles.jsonl)")
    held = Exclusions.load_all(DEFAULT_EXCLUDE).wikitext_ids
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        article = json.loads(line)
        if article["id"] in held:
            out.append({"id": article["id"], "title": article["title"],
                        "text": article["text"].replace("<unk>", UNK_BLANK)})
    if not out:
        raise ValueError(f"no held-out article found in {path}")
    return out[:limit]
