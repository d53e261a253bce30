"""Long training prompts (about 1k-4k tokens): what users send and the short sources never reach.

The drafters trained on prompts of at most ~750 tokens; users paste whole articles and several retrieved
passages. These sources turn the same corpora into long prompts: whole WikiText-2 articles and Rust Book
chapters to summarize, questions over 5-8 passages, and Topical-Chat conversations replayed for 6-10
exchanges. Held-out items are skipped as in prompt_sources.py. `build_prompts(long=True)` adds them.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from specdec.training.prompt_sources import (
    TOPICAL_CHAT_FILES,
    Exclusions,
    TrainPrompt,
    _jsonl,
    rag_prompt,
    rag_question,
    wiki_chunks,
)

MIN_WORDS, MAX_WORDS = 700, 2600  # about 1k-3.5k tokens of running text


def _cut(paragraphs: list[str], words: int) -> str:
    """Whole paragraphs up to `words` words (the first one cut if it alone is longer)."""
    out, n = [], 0
    for par in paragraphs:
        w = par.split()
        if n and n + len(w) > words:
            break
        out.append(" ".join(w[: words - n]))
        n += len(w)
    return "\n\n".join(out)


def long_articles(root: Path, ex: Exclusions, rng: random.Random) -> list[TrainPrompt]:
    out = []
    for d in _jsonl(root / "wikitext2" / "articles.jsonl"):
        if d["id"] in ex.wikitext_ids:
            continue
        paragraphs = wiki_chunks(d["text"], lo=1, hi=400)
        if sum(len(p.split()) for p in paragraphs) < MIN_WORDS:
            continue
        text = _cut(paragraphs, rng.randint(MIN_WORDS, MAX_WORDS))
        out.append(TrainPrompt(f"longwiki-{d['id']}", "summarization", ("Summarize the following article:\n\n" + text,)))
    for d in _jsonl(root / "rust_book" / "chapters.jsonl"):
        paragraphs = [p.strip() for p in d["text"].split("\n\n") if p.strip()]
        if sum(len(p.split()) for p in paragraphs) < MIN_WORDS:
            continue
        text = _cut(paragraphs, rng.randint(MIN_WORDS, MAX_WORDS))
        out.append(TrainPrompt(f"longrust-{d['id']}", "summarization", ("Summarize the following text:\n" + text,)))
    return out


def long_rag(root: Path, ex: Exclusions, rng: random.Random) -> list[TrainPrompt]:
    """A question over 5-8 passages of different articles, one of which holds the answer."""
    articles = [d for d in _jsonl(root / "wikitext2" / "articles.jsonl") if d["id"] not in ex.wikitext_ids]
    pool = [(d["id"], c) for d in articles for c in wiki_chunks(d["text"], lo=150, hi=350)]
    out = []
    for d in articles:
        mine = [c for aid, c in pool if aid == d["id"]]
        for j, gold in enumerate(rng.sample(mine, min(2, len(mine)))):
            question = rag_question(gold, d["title"], j, "What do the passages say about {title}?")
            if question is None:
                continue
            others = [c for aid, c in rng.sample(pool, 12) if aid != d["id"]][: rng.randint(4, 7)]
            out.append(TrainPrompt(f"longrag-{d['id']}-{j}", "rag", (rag_prompt([gold, *others], question, rng),)))
    return out


def long_chat(root: Path, ex: Exclusions, rng: random.Random) -> list[TrainPrompt]:
    """Topical-Chat conversations replayed for 6-10 exchanges, then the next user turn."""
    files = [json.loads((root / "topical_chat" / name).read_text(encoding="utf-8")) for name in TOPICAL_CHAT_FILES]
    # the reading sets' fun facts recur word for word across conversations: none of a held-out one's messages
    held = {m["message"].strip() for convs in files for cid, conv in convs.items() if cid in ex.topical_chat_ids
            for m in conv["content"] if len(m["message"].strip()) >= 40}
    out = []
    for convs in files:
        for cid, conv in convs.items():
            msgs = [m["message"] for m in conv["content"]]
            if cid in ex.topical_chat_ids or len(msgs) < 14 or any(h in m for m in msgs for h in held):
                continue
            n_turns = rng.randint(7, min(11, len(msgs) // 2))
            turns = tuple(msgs[0 : 2 * n_turns : 2])
            answers = tuple(msgs[1 : 2 * n_turns - 1 : 2])
            out.append(TrainPrompt(f"longchat-{cid}", "chat", turns, answers))
    return out


LONG_SOURCES = {"long_articles": long_articles, "long_rag": long_rag, "long_chat": long_chat}
