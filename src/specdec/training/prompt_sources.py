"""Training prompts of mixed kinds, built from the corpora in ../shared/data/train.

Every source becomes a list of `TrainPrompt` (turns + earlier answers, rendered like the benchmark's
prompts so the drafter sees the same format). Items used by the held-out benchmarks
(`benchmarks/prompts/other_kinds.exclude.json` and `benchmarks/prompts/held_out.exclude.json`) are skipped;
../shared/data/eval is never read.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_DATA_DIR = Path(__file__).resolve().parents[3].parent / "shared" / "data" / "train"
_PROMPTS_DIR = Path(__file__).resolve().parents[3] / "benchmarks" / "prompts"
# Every held-out benchmark's exclusion list; all of them are applied (a missing one is an error).
DEFAULT_EXCLUDE: tuple[Path, ...] = (_PROMPTS_DIR / "other_kinds.exclude.json", _PROMPTS_DIR / "held_out.exclude.json")
ExcludeArg = Path | str | Sequence[Path | str] | None
MAX_PASSAGE_WORDS = 320  # keeps summarization/RAG prompts near 500 tokens


@dataclass(frozen=True)
class TrainPrompt:
    id: str
    kind: str
    turns: tuple[str, ...]
    answers: tuple[str, ...] = field(default=())  # earlier answers of a multi-turn prompt


@dataclass(frozen=True)
class Exclusions:
    tatoeba_lines: frozenset[int]
    tatoeba_texts: frozenset[str]
    wikitext_ids: frozenset[str]
    webquestions: frozenset[str]  # qIds and qTexts
    topical_chat_ids: frozenset[str] = frozenset()  # conversation ids (the keys of topical_chat/*.json)
    topical_chat_urls: frozenset[str] = frozenset()  # article_url of those conversations (writing tasks)
    gsm8k_indices: frozenset[int] = frozenset()  # 0-based line numbers in gsm8k_train/train.jsonl

    @classmethod
    def load(cls, path: Path | None) -> Exclusions:
        """One exclusion list (`benchmarks/prompts/*.exclude.json`); a section a file lacks excludes nothing."""
        if path is None or not Path(path).is_file():
            raise FileNotFoundError(f"exclusion list not found: {path} (held-out prompts must never be trained on)")
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        known = ("tatoeba_deu_eng", "wikitext2", "webquestions", "topical_chat", "gsm8k_train")
        if not isinstance(data, dict) or not any(k in data for k in known):
            raise ValueError(f"{path}: not an exclusion list (it has none of {', '.join(known)})")
        tat = data.get("tatoeba_deu_eng", {})
        web = data.get("webquestions", {}).get("items", [])
        chat = data.get("topical_chat", {})
        return cls(
            tatoeba_lines=frozenset(tat.get("line_numbers", [])),
            tatoeba_texts=frozenset(tat.get("deu", []) + tat.get("eng", [])),
            wikitext_ids=frozenset(data.get("wikitext2", {}).get("article_ids", [])),
            webquestions=frozenset([w["qId"] for w in web] + [w["qText"] for w in web]),
            topical_chat_ids=frozenset(chat.get("conversation_ids", [])),
            topical_chat_urls=frozenset(chat.get("article_urls", [])),
            gsm8k_indices=frozenset(data.get("gsm8k_train", {}).get("indices", [])),
        )

    @classmethod
    def load_all(cls, paths: ExcludeArg) -> Exclusions:
        """The union of several exclusion lists (one path or a sequence); None or no path is an error."""
        if paths is None or isinstance(paths, (str, Path)):
            paths = [paths]
        if not paths:
            raise FileNotFoundError("no exclusion list given (held-out prompts must never be trained on)")
        parts = [cls.load(Path(p) if p is not None else None) for p in paths]
        return cls(*(frozenset().union(*(getattr(e, f) for e in parts)) for f in cls.__dataclass_fields__))


def _jsonl(path: Path) -> Iterator[dict]:
    with path.open(encoding="utf-8") as f:
        for line in f:
            if line.strip():
                yield json.loads(line)


def _passage(text: str, rng: random.Random) -> str:
    words = text.split()
    if len(words) <= MAX_PASSAGE_WORDS:
        return text.strip()
    start = rng.randrange(0, len(words) - MAX_PASSAGE_WORDS)
    return " ".join(words[start : start + MAX_PASSAGE_WORDS])


# A source returns None in place of a held-out item: build_prompts shuffles the list with its placeholders and
# drops them afterwards, so holding items out changes no random draw (of this source or of the later ones).
Items = list[TrainPrompt | None]


def _gsm8k(root: Path, ex: Exclusions, rng: random.Random) -> Items:
    return [
        None if i in ex.gsm8k_indices else TrainPrompt(f"gsm8k-{i}", "math", (d["question"],))
        for i, d in enumerate(_jsonl(root / "gsm8k_train" / "train.jsonl"))
    ]


def _mbpp(root: Path, ex: Exclusions, rng: random.Random) -> list[TrainPrompt]:
    out = []
    for d in _jsonl(root / "mbpp" / "mbpp.jsonl"):
        test = (d.get("test_list") or [""])[0]
        text = d["text"] + (f" Your code should pass this test:\n{test}" if test else "")
        out.append(TrainPrompt(f"mbpp-{d.get('task_id')}", "code", (text,)))
    return out


def _stdlib(root: Path, ex: Exclusions, rng: random.Random) -> list[TrainPrompt]:
    out = []
    for i, d in enumerate(_jsonl(root / "python_stdlib_code" / "functions.jsonl")):
        if i % 2:
            text = f"Explain what this Python code does:\n```python\n{d['source'].strip()}\n```"
        else:
            head = d["source"].split("\n", 1)[0]
            text = f"Implement this Python function.\n{head}\n    \"\"\"{d['docstring'].strip()}\"\"\""
        out.append(TrainPrompt(f"stdlib-{i}", "code", (text,)))
    return out


def _self_instruct(root: Path, ex: Exclusions, rng: random.Random) -> list[TrainPrompt]:
    out = []
    for name in ("seed_tasks.jsonl", "user_oriented_instructions.jsonl"):
        for d in _jsonl(root / "self_instruct" / name):
            for j, inst in enumerate(d.get("instances") or [{"input": ""}]):
                text = d["instruction"] + (f"\n{inst['input']}" if inst.get("input") else "")
                out.append(TrainPrompt(f"selfinstruct-{d['id']}-{j}", "chat", (text,)))
    return out


def _arena(root: Path, ex: Exclusions, rng: random.Random) -> list[TrainPrompt]:
    out = []
    for name in ("arena-hard-v0.1_question.jsonl", "arena-hard-v2.0_question.jsonl"):
        for d in _jsonl(root / "arena_hard_prompts" / name):
            if len(d["prompt"].split()) <= 600:
                out.append(TrainPrompt(f"arena-{d['uid']}", "chat", (d["prompt"],)))
    return out


TOPICAL_CHAT_FILES = ("valid_freq.json", "valid_rare.json", "test_freq.json", "test_rare.json")


def _topical_chat(root: Path, ex: Exclusions, rng: random.Random) -> Items:
    out: Items = []
    for name in TOPICAL_CHAT_FILES:
        convs = json.loads((root / "topical_chat" / name).read_text(encoding="utf-8"))
        for cid, conv in convs.items():
            msgs = [m["message"] for m in conv["content"]]
            n_turns = rng.randint(1, min(4, len(msgs) // 2))  # replay a few exchanges, then ask the next
            if cid in ex.topical_chat_ids:  # drawn all the same, so the other conversations' draws stay
                out.append(None)
                continue
            turns = tuple(msgs[0 : 2 * n_turns : 2])
            answers = tuple(msgs[1 : 2 * n_turns - 1 : 2])
            out.append(TrainPrompt(f"topical-{cid}", "chat", turns, answers))
    return out


WRITING_TASKS = (
    "Write a blog post about this news story: {h}.",
    "Write a short persuasive essay inspired by the headline \"{h}\".",
    "Draft an email to a friend telling them about this story: {h}.",
    "Write a short story based on the headline \"{h}\".",
    "Write a poem inspired by this headline: {h}.",
    "Write a social media post sharing this news: {h}.",
    "Write the opening paragraphs of a news article titled \"{h}\".",
    "Write a short speech for a community event about this topic: {h}.",
    "Write a letter to the editor responding to the article \"{h}\".",
)


def headline_from_url(url: str) -> str | None:
    """'.../2018/08/26/adrian-peterson-feels-strong-after-redskins-debut/' -> 'Adrian peterson feels strong
    after redskins debut': the path segment with the most alphabetic words (not the story's hex id)."""
    best: list[str] = []
    for segment in url.split("?")[0].split("/"):
        words = segment.removesuffix(".html").split("-")
        if sum(w.isalpha() for w in words) > sum(w.isalpha() for w in best):
            best = words
    if sum(w.isalpha() for w in best) < 3:
        return None
    text = " ".join(best)
    return text[0].upper() + text[1:]


def _writing(root: Path, ex: Exclusions, rng: random.Random) -> Items:
    """Writing tasks (blog posts, emails, stories, letters) on the news stories Topical-Chat talks about.
    The story of a held-out conversation is skipped (even where another conversation talks about it too)."""
    urls: set[str] = set()
    held = set(ex.topical_chat_urls)
    for name in TOPICAL_CHAT_FILES:
        convs = json.loads((root / "topical_chat" / name).read_text(encoding="utf-8"))
        urls.update(conv["article_url"] for conv in convs.values() if conv.get("article_url"))
        held.update(conv["article_url"] for cid, conv in convs.items()
                    if cid in ex.topical_chat_ids and conv.get("article_url"))
    out: Items = []
    for i, url in enumerate(sorted(urls)):  # every story keeps its index i and its draw, held out or not
        headline = headline_from_url(url)
        if headline is None:
            continue
        for j, task in enumerate(rng.sample(WRITING_TASKS, 2)):
            out.append(None if url in held else
                       TrainPrompt(f"writing-{i}-{j}", "writing", (task.format(h=headline),)))
    return out


UNK_BLANK = "___"  # WikiText-2's <unk> (a rare word) shown as a blank, as the benchmark's prompts show it
YEAR = re.compile(r"\b(1[5-9]\d\d|20[0-2]\d)\b")


def wiki_chunks(text: str, lo: int = 120, hi: int = 380) -> list[str]:
    """Runs of whole paragraphs of an article body (headings dropped, <unk> blanked), lo..hi words each
    (a longer paragraph is cut at hi words)."""
    paragraphs = [p.strip().replace("<unk>", UNK_BLANK) for p in text.split("\n\n")]
    paragraphs = [p for p in paragraphs if p and not p.startswith("=") and len(p.split()) >= 6]
    chunks, current = [], []
    for par in paragraphs:
        words = par.split()[:hi]
        if current and len(current) + len(words) > hi:
            if len(current) >= lo:
                chunks.append(" ".join(current))
            current = []
        current += words
    if len(current) >= lo:
        chunks.append(" ".join(current))
    return chunks


def rag_prompt(passages: list[str], question: str, rng: random.Random) -> str:
    """The passages in a random order, numbered, then the question: the benchmark's RAG layout."""
    passages = list(passages)
    rng.shuffle(passages)
    body = "\n".join(f"Passage {n}: {p}" for n, p in enumerate(passages, 1))
    return f"Use the passages to answer.\n\n{body}\n\nQuestion: {question}"


def rag_question(gold: str, title: str, j: int, about: str) -> str | None:
    """A question the passage `gold` of the article `title` answers: what happened in a year it names (every
    other question, or when the title has a blank), else `about` with the title; None when neither fits."""
    years = YEAR.findall(gold)
    title = title.replace("<unk>", UNK_BLANK)
    if years and (j % 2 or UNK_BLANK in title):
        return f"According to the passages, what happened in {years[0]}?"
    if UNK_BLANK not in title:
        return about.format(title=title)
    return None


def _wiki(root: Path, ex: Exclusions, rng: random.Random) -> list[TrainPrompt]:
    """Summaries of WikiText-2 passages, and questions over three passages (one answers it). Articles held
    out for the benchmark are skipped; <unk> (about 6% of the words) shows as a blank."""
    articles = [d for d in _jsonl(root / "wikitext2" / "articles.jsonl") if d["id"] not in ex.wikitext_ids]
    chunks = {d["id"]: wiki_chunks(d["text"]) for d in articles}
    pool = [(aid, c) for aid, cs in chunks.items() for c in cs]
    out = []
    for d in articles:
        mine = chunks[d["id"]]
        for j, chunk in enumerate(rng.sample(mine, min(3, len(mine)))):
            text = "Summarize the following article:\n\n" + chunk
            out.append(TrainPrompt(f"wiki-{d['id']}-{j}", "summarization", (text,)))
        for j, gold in enumerate(rng.sample(mine, min(2, len(mine)))):
            gold = " ".join(gold.split()[:150])
            question = rag_question(gold, d["title"], j, "What is {title}?")
            if question is None:
                continue
            others = [" ".join(c.split()[:150]) for aid, c in rng.sample(pool, 6) if aid != d["id"]][:2]
            out.append(TrainPrompt(f"wikirag-{d['id']}-{j}", "rag", (rag_prompt([gold, *others], question, rng),)))
    return out


def _webquestions(root: Path, ex: Exclusions, rng: random.Random) -> list[TrainPrompt]:
    out = []
    for name in ("trainmodel.json", "val.json", "devtest.json", "test.json"):
        for d in json.loads((root / "webquestions" / name).read_text(encoding="utf-8")):
            if d["qId"] in ex.webquestions or d["qText"] in ex.webquestions:
                continue
            out.append(TrainPrompt(f"webq-{d['qId']}", "qa", (d["qText"],)))
    return out


def _tatoeba(root: Path, ex: Exclusions, rng: random.Random) -> list[TrainPrompt]:
    lines = (root / "tatoeba_deu_eng" / "tatoeba.deu-eng.deu").read_text(encoding="utf-8").splitlines()
    keep = [t for n, t in enumerate(lines, 1) if n not in ex.tatoeba_lines and t not in ex.tatoeba_texts]
    out, i = [], 0
    while i < len(keep):
        k = rng.randint(1, 6)
        text = "Translate the following German text to English:\n" + " ".join(keep[i : i + k])
        out.append(TrainPrompt(f"tatoeba-{i}", "translation", (text,)))
        i += k
    return out


def _articles(root: Path, ex: Exclusions, rng: random.Random) -> list[TrainPrompt]:
    out = []
    for d in _jsonl(root / "rust_book" / "chapters.jsonl"):
        for j in range(2):
            text = "Summarize the following text:\n" + _passage(d["text"], rng)
            out.append(TrainPrompt(f"rust-{d['id']}-{j}", "summarization", (text,)))
    for d in _jsonl(root / "python_reference_topics" / "topics.jsonl"):
        passage = _passage(d["text"], rng)
        out.append(TrainPrompt(f"pyref-{d['topic']}", "summarization", ("Summarize the following text:\n" + passage,)))
        q = f"Use the passage to answer the question.\nPassage: {passage}\nQuestion: What is {d['topic']} about?"
        out.append(TrainPrompt(f"pyrag-{d['topic']}", "rag", (q,)))
    return out


SOURCES: dict[str, Callable[[Path, Exclusions, random.Random], Items]] = {
    "gsm8k": _gsm8k,
    "mbpp": _mbpp,
    "stdlib": _stdlib,
    "self_instruct": _self_instruct,
    "arena": _arena,
    "topical_chat": _topical_chat,
    "webquestions": _webquestions,
    "tatoeba": _tatoeba,
    "articles": _articles,
    "writing": _writing,  # new sources go last: adding one must not change the earlier ones' random draws
    "wiki": _wiki,
}


def build_prompts(
    data_dir: Path = DEFAULT_DATA_DIR, exclude: ExcludeArg = DEFAULT_EXCLUDE, seed: int = 0, long: bool = False
) -> list[TrainPrompt]:
    """All prompts, interleaved across sources so any prefix of the list is a mix of kinds. `exclude`: one
    exclusion list or several (default: every held-out benchmark's); their items are all skipped. `long`
    adds the long prompts of long_prompts.py (1k-4k tokens; opt-in, so the default list never changes)."""
    data_dir = Path(data_dir)
    if "eval" in data_dir.resolve().parts:
        raise ValueError(f"refusing to build training prompts from an eval directory: {data_dir}")
    if not data_dir.is_dir():
        raise FileNotFoundError(f"training corpora not found: {data_dir}")
    ex = Exclusions.load_all(exclude)
    rng = random.Random(seed)
    pools = []
    sources = dict(SOURCES)
    if long:
        from specdec.training.long_prompts import LONG_SOURCES

        sources.update(LONG_SOURCES)
    for name, build in sources.items():
        items = build(data_dir, ex, rng)
        rng.shuffle(items)  # held-out items are None here: the shuffle draws as if they were present
        pools.append([p for p in items if p is not None])
    mixed: list[TrainPrompt] = []
    while any(pools):
        for pool in pools:
            if pool:
                mixed.append(pool.pop())
    return mixed
