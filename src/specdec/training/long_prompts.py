"""Long training prompts (about 1k-4k tokens): what users send and the short sources never reach.

The drafters trained on prompts of at most ~750 tokens; users paste whole articles and several retrieved
passages. These sources turn the same corpora into long prompts: whole WikiText-2 articles and Rust Book
chapters to summarize, questions over 5-8 passages, and Topical-Chat conversations replayed for 6-10
exchanges. Held-out items are skipped as in prompt_sources.py. `build_prompts(long=True)` adds them.

Those first sources hold only about 320 prompts over 1k tokens, so later ones add more of what users send:
the later half of each long article or chapter, CPython's reference documentation, more RAG questions per
article, and whole runs of one stdlib module's functions to explain (long code). Each new source comes after
the first ones in LONG_SOURCES, so the earlier prompts (and the ids of data made from them) do not change.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
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


def _window(paragraphs: list[str], rng: random.Random) -> str | None:
    """MIN_WORDS-MAX_WORDS words of whole paragraphs from the first (a random length: one draw), or None
    (and no draw) when the paragraphs hold fewer than MIN_WORDS words."""
    if sum(len(p.split()) for p in paragraphs) < MIN_WORDS:
        return None
    return _cut(paragraphs, rng.randint(MIN_WORDS, MAX_WORDS))


def _paragraphs(text: str) -> list[str]:
    """A plain text's paragraphs (split at blank lines)."""
    return [p.strip() for p in text.split("\n\n") if p.strip()]


def _wiki_paragraphs(d: dict) -> list[str]:
    return wiki_chunks(d["text"], lo=1, hi=400)


def long_articles(root: Path, ex: Exclusions, rng: random.Random) -> list[TrainPrompt]:
    out = []
    for d in _jsonl(root / "wikitext2" / "articles.jsonl"):
        if d["id"] not in ex.wikitext_ids and (text := _window(_wiki_paragraphs(d), rng)) is not None:
            out.append(TrainPrompt(f"longwiki-{d['id']}", "summarization",
                                   ("Summarize the following article:\n\n" + text,)))
    for d in _jsonl(root / "rust_book" / "chapters.jsonl"):
        if (text := _window(_paragraphs(d["text"]), rng)) is not None:
            out.append(TrainPrompt(f"longrust-{d['id']}", "summarization", ("Summarize the following text:\n" + text,)))
    return out


def _rag_over_articles(root: Path, ex: Exclusions, rng: random.Random,
                       golds: Callable[[list[str]], list[tuple[int, str]]], about: str) -> list[TrainPrompt]:
    """Per WikiText-2 article, a question over 5-8 passages of different articles for each (number, gold
    passage) that `golds` picks from the article's own passages; the gold one holds the answer."""
    articles = [d for d in _jsonl(root / "wikitext2" / "articles.jsonl") if d["id"] not in ex.wikitext_ids]
    pool = [(d["id"], c) for d in articles for c in wiki_chunks(d["text"], lo=150, hi=350)]
    out = []
    for d in articles:
        for j, gold in golds([c for aid, c in pool if aid == d["id"]]):
            question = rag_question(gold, d["title"], j, about)
            if question is None:
                continue
            others = [c for aid, c in rng.sample(pool, 12) if aid != d["id"]][: rng.randint(4, 7)]
            out.append(TrainPrompt(f"longrag-{d['id']}-{j}", "rag", (rag_prompt([gold, *others], question, rng),)))
    return out


def long_rag(root: Path, ex: Exclusions, rng: random.Random) -> list[TrainPrompt]:
    """Two questions per article, on gold passages drawn at random."""
    return _rag_over_articles(root, ex, rng, lambda mine: list(enumerate(rng.sample(mine, min(2, len(mine))))),
                              "What do the passages say about {title}?")


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


def long_later_halves(root: Path, ex: Exclusions, rng: random.Random) -> list[TrainPrompt]:
    """The later half of each long WikiText-2 article and Rust Book chapter (from its middle paragraph on, when
    that alone is long enough): the first window reads their start."""
    out = []
    for d in _jsonl(root / "wikitext2" / "articles.jsonl"):
        paragraphs = _wiki_paragraphs(d)
        if d["id"] not in ex.wikitext_ids and (text := _window(paragraphs[len(paragraphs) // 2 :], rng)) is not None:
            out.append(TrainPrompt(f"longwiki2-{d['id']}", "summarization",
                                   ("Summarize the following part of an article:\n\n" + text,)))
    for d in _jsonl(root / "rust_book" / "chapters.jsonl"):
        paragraphs = _paragraphs(d["text"])
        if (text := _window(paragraphs[len(paragraphs) // 2 :], rng)) is not None:
            out.append(TrainPrompt(f"longrust2-{d['id']}", "summarization",
                                   ("Summarize the following part of a text:\n" + text,)))
    return out


def long_reference_docs(root: Path, ex: Exclusions, rng: random.Random) -> list[TrainPrompt]:
    """CPython's reference documentation topics of at least MIN_WORDS words."""
    out = []
    for d in _jsonl(root / "python_reference_topics" / "topics.jsonl"):
        if (text := _window(_paragraphs(d["text"]), rng)) is not None:
            out.append(TrainPrompt(f"longpyref-{d['topic']}", "summarization",
                                   ("Summarize the following documentation:\n\n" + text,)))
    return out


def long_rag_more(root: Path, ex: Exclusions, rng: random.Random) -> list[TrainPrompt]:
    """Two more questions per article (numbered 2 and 3), on its last and second-to-last passages."""
    return _rag_over_articles(root, ex, rng, lambda mine: [(j, mine[-(j - 1)]) for j in (2, 3) if len(mine) > j],
                              "What do the passages tell about {title}?")


CODE_MIN_CHARS, CODE_MAX_CHARS = 4000, 12000  # about 1k-3.5k tokens of Python


def long_code(root: Path, ex: Exclusions, rng: random.Random) -> list[TrainPrompt]:
    """Runs of one stdlib module's functions (in the corpus's order), 4-12k characters, to explain."""
    modules: dict[str, list[str]] = {}
    for d in _jsonl(root / "python_stdlib_code" / "functions.jsonl"):
        modules.setdefault(d["module"], []).append(d["source"].strip())
    out = []
    for module, sources in modules.items():
        j, run, size = 0, [], 0
        limit = rng.randint(CODE_MIN_CHARS, CODE_MAX_CHARS)
        for src in sources:
            if run and size + len(src) > limit:
                if size >= CODE_MIN_CHARS:
                    code = "\n\n".join(run)
                    out.append(TrainPrompt(f"longcode-{module}-{j}", "code", (
                        f"Explain what the following Python code from the `{module}` module does, function by "
                        f"function:\n```python\n{code}\n```",)))
                    j += 1
                run, size, limit = [], 0, rng.randint(CODE_MIN_CHARS, CODE_MAX_CHARS)
            run.append(src)
            size += len(src) + 2
    return out


# the first three's order and draws are fixed: data sets made from them resume by prompt id
LONG_SOURCES = {"long_articles": long_articles, "long_rag": long_rag, "long_chat": long_chat,
                "long_later_halves": long_later_halves, "long_reference_docs": long_reference_docs,
                "long_rag_more": long_rag_more, "long_code": long_code}
