#!/usr/bin/env python3
"""Builds the held-out evaluation set that resembles what users send (long inputs, chat, code, math, translation).

    .venv/bin/python scripts/make_held_out_eval.py [--data-dir ../shared/data/train] [--eval-dir ../shared/data/eval]
                                                   [--datasets-dir datasets] [--out-dir benchmarks/prompts]
                                                   [--model gemma-3-270m]

Writes, in the MT-Bench schema (one JSON object a line):
    benchmarks/prompts/held_out.jsonl          32 prompts, question_id 2000..2031:
        {"question_id", "category", "turns", ["answers"], ["reference"], "source", "approx_tokens"}
    benchmarks/prompts/held_out.exclude.json   the source items used; drafter training must skip them
    benchmarks/prompts/licenses/               licence texts of the sources (Topical-Chat, HumanEval, GSM8K, ...)

Categories (in this order):
    summarization  6  "Summarize the following article:\\n\\n" + the start of a WikiText-2 article, cut at a
                      paragraph end; 1,000-3,000 tokens
    rag            6  5-8 passages (150-350 words) from WikiText-2 articles, one answers the question;
                      1,000-3,000 tokens
    chat           5  Topical-Chat: 4-8 recorded exchanges given as `answers`, the next user message is asked
    code           4  HumanEval prompts (an eval set; training never reads it)
    math           5  GSM8K train questions from a held-out split; reference = the final number
    translation    6  3 DE->EN and 3 EN->DE, 8-14 Tatoeba sentences each

Only items no drafter has been trained on are used: the WikiText-2 articles and Tatoeba lines are those of
other_kinds.exclude.json (excluded from all training already); the Topical-Chat conversations and GSM8K
questions come from a hash-defined held-out split (sha1 of the id mod 20 == 0) minus anything in a committed
data set (datasets/*/samples.jsonl.gz). `approx_tokens` is the length of the prompt `specdec bench` feeds the
default target (gemma-3-270m tokenizer, `specdec.bench.prompts` rendering).

Deterministic: fixed seed, sorted inputs, no network. Running it twice gives byte-identical files.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import random
import re
import shutil
import statistics
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT / "src"))

SEED = 20250601
FIRST_QUESTION_ID = 2000
COUNTS = {"summarization": 6, "rag": 6, "chat": 5, "code": 4, "math": 5, "translation": 6}
LONG_TOKENS = (1000, 3000)  # summarization and rag prompts
CHAT_TOKENS = (300, 1500)
HELD_OUT_MOD = 20  # the held-out split: int(sha1(id).hexdigest(), 16) % 20 == 0

UNK = "<unk>"
BLANK = "___"  # <unk> is a special token for Gemma/Llama tokenizers; shown as a blank (as prompt_sources does)
SUMMARIZE = "Summarize the following article:\n\n"
RAG_HEAD = "Use the passages to answer.\n\n"
CODE_HEAD = "Complete the following Python function:\n```python\n{prompt}```"
DE_EN = "Translate the following German text to English:\n"
EN_DE = "Translate the following English text to German:\n"

# Summarization: one prompt per token ceiling; the article start is cut at the last paragraph end under it.
SUMMARY_CEILINGS = (3000, 2750, 2450, 2100, 1700, 1300)
# RAG: (passages, lowest tokens, highest tokens) per prompt.
RAG_PLANS = ((8, 2500, 2950), (7, 2150, 2550), (6, 1800, 2200), (5, 1500, 1850), (6, 1250, 1600), (5, 1050, 1400))
PASSAGE_WORDS = (150, 350)
SHORT_PASSAGE = 230  # words; short passages let 5-8 of them fit the smaller token budgets
MAX_PASSAGE_UNK = 0.03  # <unk> per word in a RAG passage (the articles have 3-8 %)
TRANSLATION_SENTENCES = (8, 14)

LICENSE_FILES = [  # (source, licenses/<name>); the WikiText-2 and Tatoeba notices are there already
    ("train", "topical_chat/DATALICENSE-CDLA-Sharing-1.0", "topical_chat.DATALICENSE-CDLA-Sharing-1.0.txt"),
    ("train", "gsm8k_train/LICENSE", "gsm8k.LICENSE-MIT.txt"),
    ("eval", "human_eval/LICENSE", "human_eval.LICENSE-MIT.txt"),
    ("train", "tatoeba_deu_eng/LICENSE-NOTICE.txt", "tatoeba_deu_eng.LICENSE-NOTICE.txt"),
    ("train", "wikitext2/LICENSE-NOTICE.txt", "wikitext2.LICENSE-NOTICE.txt"),
    ("train", "wikitext2/LICENSE.pytorch-examples-BSD-3-Clause", "wikitext2.pytorch-examples-BSD-3-Clause.txt"),
]


def held_out(key: str) -> bool:
    return int(hashlib.sha1(key.encode("utf-8")).hexdigest(), 16) % HELD_OUT_MOD == 0


def rel(path: Path) -> str:
    return os.path.relpath(path.resolve(), REPO_ROOT)


class Counter:
    """Prompt length in tokens, exactly as the benchmark renders it for the target."""

    def __init__(self, model: str):
        from specdec.bench.prompts import render_prompt
        from specdec.models.loading import load_tokenizer

        self.tokenizer = load_tokenizer(model)
        self._render = render_prompt

    def __call__(self, turns: list[str], answers: list[str] | None = None) -> int:
        answers = [a if a[:1].isspace() else " " + a for a in answers or []]  # as load_questions gives them
        return len(self._render(self.tokenizer, turns, answers))


# ---------------------------------------------------------------------------------------------- WikiText-2

YEAR = re.compile(r"\b(1[5-9]\d\d|20[0-2]\d)\b")
PRONOUN = re.compile(r"(It|He|She|They|This|These|That|Those|Its|His|Her|Their|There|However|Both)\b")
NOT_A_STOP = {"Mr.", "Mrs.", "Ms.", "Dr.", "St.", "Jr.", "Sr.", "No.", "Lt.", "Gen.", "Col.", "Capt.", "Sgt.", "Maj.",
              "Gov.", "Rev.", "Mt.", "Co.", "Inc.", "Ltd.", "vs.", "c.", "ca.", "e.g.", "i.e.", "U.S.", "U.K.",
              "Jan.", "Feb.", "Aug.", "Sept.", "Oct.", "Nov.", "Dec.", "pp.", "p.", "Vol."}


def tidy(text: str) -> str:
    """WikiText-2's spaced ranges ("5 – 6", "1888 – 89") joined; everything else is as in articles.jsonl."""
    text = re.sub(r"(\d) – (\d)", r"\1–\2", text)
    return re.sub(r"\s+", " ", text).strip()


def show(text: str) -> str:
    return text.replace(UNK, BLANK)


def words(text: str) -> int:
    return len(text.split())


def sentences(paragraph: str) -> list[str]:
    """Splits after . ! ? (and a closing quote or bracket) followed by a space and a capital, digit or quote;
    not after titles, common abbreviations and initials."""
    out, start = [], 0
    for m in re.finditer(r"[.!?][\"')\]]?(?= [A-Z0-9\"'(<])", paragraph):
        piece = paragraph[start:m.end()].strip()
        last = piece.rsplit(" ", 1)[-1]
        if last in NOT_A_STOP or re.fullmatch(r"(?:[A-Z]\.)+", last):
            continue
        out.append(piece)
        start = m.end()
    if paragraph[start:].strip():
        out.append(paragraph[start:].strip())
    return out


def prose(text: str) -> list[str]:
    """The article body's prose paragraphs: headings, lists, table and infobox remnants (short lines, lines
    without final punctuation) dropped."""
    out = []
    for par in text.split("\n\n"):
        par = tidy(par)
        if not par or par.startswith("=") or words(par) < 12 or not re.search(r"[.!?][\"')\]]?$", par):
            continue
        if re.match(r"\d{1,2} (?:[A-Z]|<unk>)", par):  # numbered list item ("1 East End Historic District — ...")
            continue
        out.append(par)
    return out


def load_articles(data: Path, ids: set[str]) -> list[dict]:
    arts = []
    with open(data / "wikitext2" / "articles.jsonl", encoding="utf-8") as f:
        for line in f:
            if line.strip():
                a = json.loads(line)
                if a["id"] in ids:
                    a["prose"] = prose(a["text"])
                    arts.append(a)
    missing = ids - {a["id"] for a in arts}
    if missing:
        raise SystemExit(f"wikitext2 articles of other_kinds.exclude.json not found: {sorted(missing)}")
    return sorted(arts, key=lambda a: a["id"])


def unk_share(text: str) -> float:
    return text.count(UNK) / max(1, words(text))


def build_summarization(arts: list[dict], count: Counter, rng: random.Random) -> tuple[list[dict], set[str]]:
    """The articles whose opening (up to the largest ceiling) has the fewest <unk>; each gets one ceiling."""
    def opening(a: dict, ceiling: int) -> tuple[str, int, int]:
        text, tokens, n = "", 0, 0
        for par in a["prose"]:
            candidate = text + ("\n\n" if text else "") + par
            t = count([SUMMARIZE + show(candidate)])
            if t > ceiling:
                break
            text, tokens, n = candidate, t, n + 1
        return text, tokens, n

    ranked = []
    for a in arts:
        text, tokens, _ = opening(a, max(SUMMARY_CEILINGS))
        if tokens >= max(SUMMARY_CEILINGS) - 400:  # long enough for any ceiling
            ranked.append((round(unk_share(text), 6), a["id"], a))
    ranked.sort(key=lambda r: (r[0], r[1]))
    chosen = [a for _, _, a in ranked[: COUNTS["summarization"]]]
    ceilings = list(SUMMARY_CEILINGS)
    rng.shuffle(ceilings)
    prompts = []
    for a, ceiling in zip(chosen, ceilings):
        text, tokens, n = opening(a, ceiling)
        prompts.append({
            "category": "summarization", "turns": [SUMMARIZE + show(text)],
            "source": f"wikitext2 {a['id']}: {show(a['title'])} (first {n} prose paragraphs)",
            "_item": {"corpus": "wikitext2", "article_id": a["id"], "title": a["title"], "paragraphs": n,
                      "words": words(text), "unk": text.count(UNK)},
        })
    return prompts, {a["id"] for a in chosen}


def passages_of(a: dict) -> list[dict]:
    """Candidate passages: consecutive whole paragraphs (a paragraph over SHORT_PASSAGE words split at sentence
    ends), grouped up to SHORT_PASSAGE and, separately, up to PASSAGE_WORDS[1] words; at least PASSAGE_WORDS[0].
    Passages of one size never overlap; `pieces` says which text they hold, so a prompt never repeats text."""
    pieces = []
    for par in a["prose"]:
        if words(par) <= SHORT_PASSAGE:
            pieces.append(par)
            continue
        part: list[str] = []
        for sent in sentences(par):
            if part and words(" ".join(part + [sent])) > SHORT_PASSAGE:
                pieces.append(" ".join(part))
                part = []
            part.append(sent)
        if part:
            pieces.append(" ".join(part))
    out = []
    for cap in (SHORT_PASSAGE, PASSAGE_WORDS[1]):
        current: list[int] = []
        groups = []
        for k, piece in enumerate(pieces):
            if current and words(" ".join(pieces[i] for i in current + [k])) > cap:
                groups.append(current)
                current = []
            current.append(k)
        groups.append(current)
        for g in groups:
            text = " ".join(pieces[i] for i in g)
            if words(text) >= PASSAGE_WORDS[0]:
                out.append({"article_id": a["id"], "pieces": frozenset(g), "text": text, "lead": g[0] == 0,
                            "cap": cap})
    for n, p in enumerate(out):
        p["index"] = n
    return out


def title_question(a: dict, lead: dict) -> tuple[str, str, str] | None:
    """(question, answer sentence, key) for "According to the passages, what is <title>?": the lead's first
    sentence must name the title near its start and say what it is."""
    title = tidy(re.sub(r"\s*\([^)]*\)$", "", a["title"]))
    if UNK in title or not title:
        return None
    first = sentences(lead["text"])[0]
    if first.count(UNK) > 1:
        return None
    m = re.match(r"(The |the )?\"?" + re.escape(title) + r"\"?(?P<rest>.*)$", first)
    if not m:
        return None
    rest = m.group("rest")
    paren = re.match(r"\s*\(([^)]*)\)", rest)
    person = bool(paren and re.search(r"\bborn\b|\d{4}\s*–", paren.group(1)))
    verb = re.search(r"\b(is|was|are|were)\b", rest)
    if not verb or verb.start() > 120:
        return None
    subject = title
    if m.group(1) and not title.startswith("The "):
        subject = "the " + title
    quoted = first.lstrip().startswith('"')
    shown = f'"{subject}"' if quoted else subject
    wh = "who" if person else "what"
    return f"According to the passages, {wh} {verb.group(1)} {shown}?", first, title


def year_questions(p: dict) -> list[tuple[str, str, str]]:
    """(question, answer sentence, year): sentences naming one year that no other sentence of the passage
    names, standing on their own (no leading pronoun, no <unk>), the year not in brackets ("(born 1990)")."""
    sents = sentences(p["text"])
    out = []
    for s in sents:
        years = set(YEAR.findall(s))
        if len(years) != 1 or UNK in s or not 8 <= words(s) <= 45 or PRONOUN.match(s):
            continue
        if set(YEAR.findall(re.sub(r"\([^)]*\)", "", s))) != years or re.search(r"\d[–-] ?\d", s):
            continue  # "(born 1990)", "the 2001–02 season"
        (year,) = years
        if sum(year in t for t in sents) == 1:
            out.append((f"According to the passages, what happened in {year}?", s, year))
    return out


def build_rag(arts: list[dict], skip: set[str], count: Counter, rng: random.Random) -> tuple[list[dict], list[str]]:
    pool = [a for a in arts if a["id"] not in skip]
    passages = {a["id"]: passages_of(a) for a in pool}

    def clean(p: dict) -> bool:
        return unk_share(p["text"]) <= MAX_PASSAGE_UNK

    # Gold candidates, cleanest article first: half title questions (lead passage), half year questions.
    ranked = sorted(pool, key=lambda a: (round(unk_share(" ".join(a["prose"])), 6), a["id"]))
    title_gold, year_gold = [], []
    for a in ranked:
        ps = [p for p in passages[a["id"]] if clean(p)]
        lead = next((p for p in ps if p["lead"] and p["cap"] == PASSAGE_WORDS[1]), None)
        lead = lead or next((p for p in ps if p["lead"]), None)
        q = title_question(a, lead) if lead is not None else None
        if q:
            title_gold.append((a, lead, q))
        for p in sorted(ps, key=lambda p: (-p["cap"], p["text"].count(UNK), p["index"])):
            ys = year_questions(p)
            if ys:
                year_gold.append((a, p, ys[0]))
                break
    gold = []
    taken: set[str] = set()
    for k in range(COUNTS["rag"]):
        kind = "title" if k % 2 == 0 else "year"
        a, p, q = next((g for g in (title_gold if kind == "title" else year_gold) if g[0]["id"] not in taken),
                       (None, None, None))
        if a is None:
            raise SystemExit(f"not enough RAG gold articles with a {kind} question")
        taken.add(a["id"])
        gold.append((a, p, q, kind))
    plans = list(RAG_PLANS)
    rng.shuffle(plans)

    used = {(p["article_id"], i) for _, p, _, _ in gold for i in p["pieces"]}  # text no other prompt repeats
    prompts = []
    for (a, gp, (question, answer, key), kind), (n, lo, hi) in zip(gold, plans):
        candidates = [p for aid in sorted(passages) if aid != a["id"] for p in passages[aid]
                      if clean(p) and not any((aid, i) in used for i in p["pieces"])
                      and key.lower() not in p["text"].lower()]
        rng.shuffle(candidates)
        size = {}
        for p in candidates + [gp]:
            size[(p["article_id"], p["index"])] = count([p["text"]]) - count(["x"]) + 1  # tokens of the text
        least, most = min(size.values()), max(size.values())
        total = count([RAG_HEAD + f"\n\nQuestion: {question}"]) + 5 * n  # head, question, "Passage k: " lines
        chosen = [gp]
        total += size[(gp["article_id"], gp["index"])]
        taken_pieces = set()
        for p in candidates:
            left = n - len(chosen) - 1
            t = total + size[(p["article_id"], p["index"])]
            if t + left * least > hi or t + left * most < lo or (left == 0 and t < lo):
                continue
            if any((p["article_id"], i) in taken_pieces for i in p["pieces"]):
                continue
            chosen.append(p)
            taken_pieces.update((p["article_id"], i) for i in p["pieces"])
            total = t
            if len(chosen) == n:
                break
        if len(chosen) != n:
            raise SystemExit(f"could not fit {n} passages in {lo}-{hi} tokens for {a['id']}")
        order = chosen[:]
        rng.shuffle(order)
        body = "\n".join(f"Passage {i}: {show(p['text'])}" for i, p in enumerate(order, 1))
        turn = f"{RAG_HEAD}{body}\n\nQuestion: {question}"
        gold_at = order.index(gp) + 1
        for p in chosen:
            used.update((p["article_id"], i) for i in p["pieces"])
        prompts.append({
            "category": "rag", "turns": [turn], "reference": [show(answer)],
            "source": f"wikitext2 {a['id']}: {show(a['title'])} (gold passage {gold_at} of {n}; "
                      f"{kind} question); other passages from "
                      + ", ".join(sorted({p['article_id'] for p in chosen if p is not gp})),
            "_item": {"corpus": "wikitext2", "gold_article_id": a["id"], "gold_passage": gold_at,
                      "question_kind": kind, "key": key,
                      "passages": [{"article_id": p["article_id"], "words": words(p["text"]),
                                    "first_words": " ".join(p["text"].split()[:12])} for p in order]},
        })
    used_articles = sorted({aid for aid, _ in used})
    return prompts, used_articles


# ---------------------------------------------------------------------------------------------- other sources

def committed_ids(datasets: Path) -> set[str]:
    """Prompt ids of every committed data set (`gen-s18/topical-...` -> `topical-...`)."""
    ids = set()
    for path in sorted(datasets.glob("*/samples.jsonl.gz")):
        with gzip.open(path, "rt", encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    ids.add(json.loads(line)["id"].rsplit("/", 1)[-1])
    if not ids:
        raise SystemExit(f"no committed data sets under {datasets} (datasets/*/samples.jsonl.gz)")
    return ids


def writing_story_index(convs: dict[str, dict]) -> dict[str, int]:
    """article_url -> i of the training builder's writing-{i}-{j} prompts (sorted URLs of all conversations)."""
    urls = sorted({c["article_url"] for c in convs.values() if c.get("article_url")})
    return {u: i for i, u in enumerate(urls)}


TOPICAL_FILES = ("valid_freq.json", "valid_rare.json", "test_freq.json", "test_rare.json")


def build_chat(data: Path, committed: set[str], count: Counter, rng: random.Random) -> tuple[list[dict], dict]:
    convs: dict[str, dict] = {}
    file_of: dict[str, str] = {}
    for name in TOPICAL_FILES:
        for cid, conv in json.loads((data / "topical_chat" / name).read_text(encoding="utf-8")).items():
            convs[cid] = conv
            file_of[cid] = name
    story = writing_story_index(convs)
    split = sorted(cid for cid in convs if held_out(cid))
    eligible = []
    for cid in split:
        if f"topical-{cid}" in committed:
            continue
        url = convs[cid].get("article_url")
        # Also keep away from stories whose writing prompts were trained on.
        if url and any(f"writing-{story[url]}-{j}" in committed for j in range(2)):
            continue
        eligible.append(cid)
    rng.shuffle(eligible)
    prompts, used = [], []
    for cid in eligible:
        content = convs[cid]["content"]
        msgs = [" ".join(m["message"].split()) for m in content]
        agents = [m["agent"] for m in content]
        exchanges = rng.randint(4, 8)
        picked = None
        for n in list(range(exchanges, 9)) + list(range(exchanges - 1, 3, -1)):
            k = 2 * n + 1  # n exchanges, then the next user message
            if len(msgs) < k or any(agents[i] == agents[i + 1] for i in range(k - 1)) or not all(msgs[:k]):
                continue
            turns, answers = msgs[0:k:2], msgs[1:k - 1:2]
            tokens = count(turns, answers)
            if CHAT_TOKENS[0] <= tokens <= CHAT_TOKENS[1]:
                picked = (n, turns, answers)
                break
        if picked is None:
            continue
        n, turns, answers = picked
        rec = {"category": "chat", "turns": turns, "answers": answers,
               "source": f"topical_chat {file_of[cid]} {cid} (messages 1-{2 * n + 1})",
               "_item": {"corpus": "topical_chat", "conversation_id": cid, "file": file_of[cid],
                         "exchanges": n, "article_url": convs[cid].get("article_url")}}
        if len(msgs) > 2 * n + 1 and agents[2 * n + 1] != agents[2 * n]:
            rec["reference"] = [msgs[2 * n + 1]]  # the partner's recorded reply
        prompts.append(rec)
        used.append(cid)
        if len(prompts) == COUNTS["chat"]:
            break
    if len(prompts) < COUNTS["chat"]:
        raise SystemExit("not enough held-out Topical-Chat conversations")
    info = {
        "files": [f"topical_chat/{n}" for n in TOPICAL_FILES],
        "held_out_split": "conversation ids whose int(sha1(id).hexdigest(), 16) % 20 == 0, not in a committed "
                          "data set (as topical-<id>), and whose story's writing-<i>-<j> prompts are not either",
        "note": "Skip these conversations (topical-<id>) and the writing tasks on their stories (article_urls).",
        "conversation_ids": sorted(used),
        "article_urls": sorted({convs[c]["article_url"] for c in used if convs[c].get("article_url")}),
    }
    return prompts, info


def build_math(data: Path, committed: set[str], rng: random.Random) -> tuple[list[dict], dict]:
    rows = [json.loads(line) for line in (data / "gsm8k_train" / "train.jsonl").read_text(encoding="utf-8").splitlines()
            if line.strip()]
    eligible = [i for i in range(len(rows)) if held_out(str(i)) and f"gsm8k-{i}" not in committed]
    chosen = sorted(rng.sample(eligible, COUNTS["math"]))
    prompts = []
    for i in chosen:
        final = rows[i]["answer"].rsplit("####", 1)[-1].strip()
        prompts.append({"category": "math", "turns": [rows[i]["question"].strip()], "reference": [final],
                        "source": f"gsm8k_train train.jsonl index {i}",
                        "_item": {"corpus": "gsm8k_train", "index": i}})
    info = {"file": "gsm8k_train/train.jsonl",
            "held_out_split": "0-based indices i with int(sha1(str(i)).hexdigest(), 16) % 20 == 0, not in a "
                              "committed data set (as gsm8k-<i>)",
            "note": "0-based line index in train.jsonl; skip these (gsm8k-<i>).",
            "indices": chosen}
    return prompts, info


def build_code(eval_dir: Path, rng: random.Random) -> tuple[list[dict], dict]:
    with gzip.open(eval_dir / "human_eval" / "HumanEval.jsonl.gz", "rt", encoding="utf-8") as f:
        tasks = [json.loads(line) for line in f if line.strip()]
    chosen = sorted(rng.sample(range(len(tasks)), COUNTS["code"]))
    prompts = [{"category": "code", "turns": [CODE_HEAD.format(prompt=tasks[i]["prompt"])],
                "source": f"human_eval {tasks[i]['task_id']}",
                "_item": {"corpus": "human_eval", "task_id": tasks[i]["task_id"]}} for i in chosen]
    info = {"file": "../eval/human_eval/HumanEval.jsonl.gz",
            "note": "An evaluation set: training never reads ../shared/data/eval, so nothing to skip; listed for "
                    "the record.",
            "task_ids": [tasks[i]["task_id"] for i in chosen]}
    return prompts, info


def build_translation(data: Path, other_kinds: dict, rng: random.Random) -> tuple[list[dict], dict]:
    deu = (data / "tatoeba_deu_eng" / "tatoeba.deu-eng.deu").read_text(encoding="utf-8").rstrip("\n").split("\n")
    eng = (data / "tatoeba_deu_eng" / "tatoeba.deu-eng.eng").read_text(encoding="utf-8").rstrip("\n").split("\n")
    lines = sorted(other_kinds["tatoeba_deu_eng"]["line_numbers"])  # 1-based, held out of all training
    groups = COUNTS["translation"]
    sizes = [TRANSLATION_SENTENCES[0]] * groups
    spare = len(lines) - sum(sizes)
    if spare < 0:
        raise SystemExit("not enough held-out Tatoeba lines")
    while spare > 0 and any(s < TRANSLATION_SENTENCES[1] for s in sizes):
        k = rng.choice([k for k, s in enumerate(sizes) if s < TRANSLATION_SENTENCES[1]])
        sizes[k] += 1
        spare -= 1
    prompts, used, pos = [], [], 0
    for k, size in enumerate(sizes):
        group = lines[pos:pos + size]
        pos += size
        de = " ".join(deu[n - 1].strip() for n in group)
        en = " ".join(eng[n - 1].strip() for n in group)
        to_english = k < groups // 2
        prompts.append({
            "category": "translation", "turns": [(DE_EN + de) if to_english else (EN_DE + en)],
            "reference": [en if to_english else de],
            "source": f"tatoeba_deu_eng lines {group[0]}-{group[-1]} ({'de->en' if to_english else 'en->de'})",
            "_item": {"corpus": "tatoeba_deu_eng", "direction": "de-en" if to_english else "en-de",
                      "line_numbers": group},
        })
        used.extend(group)
    info = {"files": ["tatoeba_deu_eng/tatoeba.deu-eng.deu", "tatoeba_deu_eng/tatoeba.deu-eng.eng"],
            "note": "1-based line numbers (all of them already in other_kinds.exclude.json); skip them in both "
                    "files, and any line whose text equals one of them.",
            "line_numbers": used, "deu": [deu[n - 1] for n in used], "eng": [eng[n - 1] for n in used]}
    return prompts, info


# ---------------------------------------------------------------------------------------------- main

def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data-dir", type=Path, default=REPO_ROOT.parent / "shared" / "data" / "train")
    ap.add_argument("--eval-dir", type=Path, default=REPO_ROOT.parent / "shared" / "data" / "eval")
    ap.add_argument("--datasets-dir", type=Path, default=REPO_ROOT / "datasets")
    ap.add_argument("--out-dir", type=Path, default=REPO_ROOT / "benchmarks" / "prompts")
    ap.add_argument("--model", default="gemma-3-270m", help="target whose tokenizer measures approx_tokens")
    args = ap.parse_args(argv)
    data, out = args.data_dir, args.out_dir
    other_kinds = json.loads((out / "other_kinds.exclude.json").read_text(encoding="utf-8"))
    count = Counter(args.model)
    committed = committed_ids(args.datasets_dir)

    arts = load_articles(data, set(other_kinds["wikitext2"]["article_ids"]))
    summarization, summary_ids = build_summarization(arts, count, random.Random(SEED + 1))
    rag, rag_ids = build_rag(arts, summary_ids, count, random.Random(SEED + 2))
    chat, chat_info = build_chat(data, committed, count, random.Random(SEED + 3))
    code, code_info = build_code(args.eval_dir, random.Random(SEED + 4))
    math, math_info = build_math(data, committed, random.Random(SEED + 5))
    translation, tatoeba_info = build_translation(data, other_kinds, random.Random(SEED + 6))

    prompts = summarization + rag + chat + code + math + translation
    assert [p["category"] for p in prompts] == [c for c, n in COUNTS.items() for _ in range(n)]
    records = []
    for n, p in enumerate(prompts):
        p["question_id"] = FIRST_QUESTION_ID + n
        rec = {"question_id": p["question_id"], "category": p["category"], "turns": p["turns"]}
        for key in ("answers", "reference", "source"):
            if key in p:
                rec[key] = p[key]
        rec["approx_tokens"] = count(p["turns"], p.get("answers"))
        assert all(UNK not in t for t in rec["turns"] + rec.get("answers", []))
        records.append(rec)

    for cat in ("summarization", "rag"):
        tokens = [r["approx_tokens"] for r in records if r["category"] == cat]
        assert all(LONG_TOKENS[0] <= t <= LONG_TOKENS[1] for t in tokens), (cat, tokens)
        assert sum(t > 2000 for t in tokens) >= 2, (cat, tokens)
    assert all(CHAT_TOKENS[0] <= r["approx_tokens"] <= CHAT_TOKENS[1] for r in records if r["category"] == "chat")

    wikitext_ids = sorted(summary_ids | set(rag_ids))
    titles = {a["id"]: a["title"] for a in arts}
    exclude = {
        "description": "Source items used by benchmarks/prompts/held_out.jsonl (held-out evaluation set). "
                       "Drafter-training data builders must skip every item listed here.",
        "generated_by": "scripts/make_held_out_eval.py",
        "seed": SEED,
        "data_dir": rel(data),
        "rule": "Never train drafters or tune methods on these prompts. Skip: the listed topical_chat "
                "conversations (topical-<id>) and the writing tasks on their stories (article_urls), the listed "
                "gsm8k_train indices (gsm8k-<i>), the listed wikitext2 articles as a whole and the tatoeba line "
                "numbers (both already in other_kinds.exclude.json). human_eval is an evaluation set that training "
                "never reads.",
        "wikitext2": {"file": "wikitext2/articles.jsonl", "exclude_whole_articles": True,
                      "note": "all of them are in other_kinds.exclude.json already",
                      "article_ids": wikitext_ids, "titles": [titles[i] for i in wikitext_ids]},
        "tatoeba_deu_eng": tatoeba_info,
        "topical_chat": chat_info,
        "gsm8k_train": math_info,
        "human_eval": code_info,
        "prompts": [{"question_id": p["question_id"], "category": p["category"], **p["_item"]} for p in prompts],
    }

    out.mkdir(parents=True, exist_ok=True)
    with open(out / "held_out.jsonl", "w", encoding="utf-8", newline="\n") as f:
        for rec in records:
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")
    with open(out / "held_out.exclude.json", "w", encoding="utf-8", newline="\n") as f:
        json.dump(exclude, f, ensure_ascii=False, indent=1)
        f.write("\n")
    (out / "licenses").mkdir(exist_ok=True)
    for root, src, dst in LICENSE_FILES:
        shutil.copyfile((data if root == "train" else args.eval_dir) / src, out / "licenses" / dst)

    # What the benchmark will read back: same prompts, same token counts.
    from specdec.bench.prompts import first_prompt, load_questions

    questions = load_questions(out / "held_out.jsonl")
    assert len(questions) == len(records)
    for q, rec in zip(questions, records):
        assert len(first_prompt(count.tokenizer, q)) == rec["approx_tokens"], q.question_id
    for cat in COUNTS:
        tokens = [r["approx_tokens"] for r in records if r["category"] == cat]
        print(f"{cat:14s} {len(tokens)} prompts, tokens min {min(tokens)} median {statistics.median(tokens):g} "
              f"max {max(tokens)}", file=sys.stderr)
    print(f"wrote {len(records)} prompts to {out / 'held_out.jsonl'} and {out / 'held_out.exclude.json'}",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
