#!/usr/bin/env python3
"""Builds the held-out "other kinds" benchmark prompt set (translation, summarization, QA, RAG).

    python3 scripts/make_other_kinds.py [--data-dir /work/shared/data/train] [--out-dir benchmarks/prompts]

Writes, in the MT-Bench schema (one JSON object a line: question_id, category, turns, optional reference):
    benchmarks/prompts/other_kinds.jsonl          48 prompts, 12 per category, question_id 1000..1047
    benchmarks/prompts/other_kinds.exclude.json   the source items used; drafter training must skip them
    benchmarks/prompts/licenses/                  licence/notice texts copied from the source corpora

Sources (offline copies under --data-dir, see its SOURCES.md):
    translation   tatoeba_deu_eng/tatoeba.deu-eng.{deu,eng}: consecutive lines from the END of the file
    summarization wikitext2/articles.jsonl: one 250-400-word chunk per article, lowest <unk> density
    qa            webquestions/test.json: seeded sample of qText, reference = answers
    rag           wikitext2/articles.jsonl (articles not used for summarization): 3 passages of 80-150 words,
                  a templated question answerable from exactly one of them

Deterministic: fixed seed, sorted inputs, Python 3 standard library only, no network. Running it twice gives
byte-identical files.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import shutil
import sys
from pathlib import Path

SEED = 20250101
FIRST_QUESTION_ID = 1000
PER_CATEGORY = 12
MAX_PROMPT_CHARS = 2800  # ~700 tokens

UNK = "<unk>"
# WikiText-2 replaced rare words with "<unk>", which several tokenizers (Llama, Gemma) parse as their special
# unknown token. Prompts show a neutral blank instead.
UNK_DISPLAY = "___"

TRANSLATION_PREFIX = "Translate German to English: "
SUMMARIZATION_PREFIX = "Summarize the following article:\n\n"
RAG_PREFIX = "Use the passages to answer.\n\n"

SUMMARY_WORDS = (250, 400)
PASSAGE_WORDS = (80, 150)

REPO_ROOT = Path(__file__).resolve().parent.parent

# Licence/notice texts shipped with the source corpora, copied next to the prompts (source -> licenses/<name>).
LICENSE_FILES = [
    ("tatoeba_deu_eng/LICENSE-NOTICE.txt", "tatoeba_deu_eng.LICENSE-NOTICE.txt"),
    ("wikitext2/LICENSE-NOTICE.txt", "wikitext2.LICENSE-NOTICE.txt"),
    ("wikitext2/LICENSE.pytorch-examples-BSD-3-Clause", "wikitext2.pytorch-examples-BSD-3-Clause.txt"),
    ("webquestions/LICENSE-CC-BY-4.0.txt", "webquestions.LICENSE-CC-BY-4.0.txt"),
]


# ---------------------------------------------------------------------------------------------- text helpers

def clean_wikitext(text: str) -> str:
    """Undoes WikiText tokenization artefacts (articles.jsonl is already lightly detokenized; this is a no-op
    for most of it). Keeps <unk> (replaced later, for display only)."""
    t = text
    t = t.replace(" @-@ ", "-").replace(" @,@ ", ",").replace(" @.@ ", ".")
    t = re.sub(r" ([,.;:!?%)\]])", r"\1", t)           # space before punctuation
    t = re.sub(r"([(\[]) ", r"\1", t)                   # space after opening bracket
    t = re.sub(r"(\w) n't\b", r"\1n't", t)              # do n't -> don't
    t = re.sub(r"(\w)n 't\b", r"\1n't", t)              # don 't -> don't
    t = re.sub(r"(\w) '(s|re|ve|ll|d|m)\b", r"\1'\2", t)  # it 's -> it's
    t = re.sub(r"(\w) ' s\b", r"\1's", t)               # U.S. ' s -> U.S.'s
    t = re.sub(r"(\ws) ' ", r"\1' ", t)                 # Beatles ' break-up -> Beatles' break-up
    t = re.sub(r"(\d) – (\d)", r"\1–\2", t)             # 1980 – 1990 -> 1980–1990 (ranges)
    t = re.sub(r"(\d): (\d\d)\b", r"\1:\2", t)           # 23: 43 -> 23:43
    t = re.sub(r" ([²³])", r"\1", t)                    # m ² -> m²
    t = re.sub(r"\b(km|m|ft|mi) / (h|s)\b", r"\1/\2", t)  # km / h -> km/h
    t = re.sub(r"[ \t]+", " ", t)
    return t.strip()


def display(text: str) -> str:
    return text.replace(UNK, UNK_DISPLAY)


def n_words(text: str) -> int:
    return len(text.split())


_ABBREV = {"U.S.", "U.K.", "Mr.", "Mrs.", "Ms.", "Dr.", "St.", "No.", "Nos.", "Jr.", "Sr.", "Mt.", "Co.", "Inc.",
           "Ltd.", "Lt.", "Gen.", "Col.", "Capt.", "Sgt.", "Maj.", "Cpl.", "Adm.", "Gov.", "Rev.", "vs.", "c.",
           "ca.", "e.g.", "i.e.", "approx.", "Vol.", "pp.", "p.", "ft.", "Ft.", "Feb.", "Jan.", "Aug.", "Sept.",
           "Oct.", "Nov.", "Dec."}


def split_sentences(paragraph: str) -> list[str]:
    """Splits after . ! ? (optionally followed by a closing quote/bracket) and whitespace, when the next
    character starts a sentence; skips common abbreviations and single-letter initials."""
    out, start = [], 0
    for m in re.finditer(r"(?<!\.)[.!?][\"')\]]?\s+(?=[A-Z\"'(\[0-9<])", paragraph):
        candidate = paragraph[start:m.end()].strip()
        last = candidate.split()[-1] if candidate.split() else ""
        if last in _ABBREV or re.fullmatch(r"[A-Z]\.", last) or re.fullmatch(r"(?:[A-Z]\.){2,}", last):
            continue
        out.append(candidate)
        start = m.end()
    tail = paragraph[start:].strip()
    if tail:
        out.append(tail)
    return out


def is_heading(par: str) -> bool:
    return bool(re.fullmatch(r"=.*=", par.strip()))


def article_sentences(text: str) -> list[tuple[int, str]]:
    """(paragraph index, sentence) for every sentence of the article body; headings dropped."""
    out = []
    pars = [p.strip() for p in text.split("\n\n")]
    pidx = 0
    for par in pars:
        if not par or is_heading(par):
            continue
        # Infobox/table remnants ("As of 1 December 2015", "FIFA Club World Cup (1): 2008") are not prose.
        if n_words(par) < 6 or not re.search(r"[.!?][\"')\]]?$", par):
            continue
        for s in split_sentences(clean_wikitext(par)):
            out.append((pidx, s))
        pidx += 1
    return out


def windows(sents: list[tuple[int, str]], lo: int, hi: int, keep_paragraphs: bool) -> list[dict]:
    """Candidate chunks: start at a paragraph start, add whole sentences while the word count stays <= hi;
    take the longest prefix with >= lo words that ends at a paragraph end, else the longest >= lo."""
    cands = []
    for i, (pidx, _) in enumerate(sents):
        if i > 0 and sents[i - 1][0] == pidx:
            continue  # not a paragraph start
        words, best, best_par_end = 0, None, None
        for j in range(i, len(sents)):
            words += n_words(sents[j][1])
            if words > hi:
                break
            if words >= lo:
                best = j
                if j + 1 == len(sents) or sents[j + 1][0] != sents[j][0]:
                    best_par_end = j
        end = best_par_end if best_par_end is not None else best
        if end is None:
            continue
        chunk = sents[i:end + 1]
        if keep_paragraphs:
            pars: list[list[str]] = []
            last = None
            for pidx, s in chunk:
                if pidx != last:
                    pars.append([])
                    last = pidx
                pars[-1].append(s)
            text = "\n\n".join(" ".join(p) for p in pars)
        else:
            text = " ".join(s for _, s in chunk)
        cands.append({"start": i, "end": end, "text": text, "sentences": [s for _, s in chunk],
                      "words": n_words(text), "unk": text.count(UNK), "paragraph": chunk[0][0]})
    return cands


# ---------------------------------------------------------------------------------------------- categories

def build_translation(data: Path, rng: random.Random) -> tuple[list[dict], dict]:
    deu_path = data / "tatoeba_deu_eng" / "tatoeba.deu-eng.deu"
    eng_path = data / "tatoeba_deu_eng" / "tatoeba.deu-eng.eng"
    deu = deu_path.read_text(encoding="utf-8").rstrip("\n").split("\n")
    eng = eng_path.read_text(encoding="utf-8").rstrip("\n").split("\n")
    assert len(deu) == len(eng), (len(deu), len(eng))
    sizes = [rng.randint(3, 6) for _ in range(PER_CATEGORY)]
    start = len(deu) - sum(sizes)  # 0-based; the groups cover the last sum(sizes) lines, in file order
    prompts, used = [], []
    pos = start
    for size in sizes:
        lines = list(range(pos, pos + size))
        pos += size
        de = " ".join(deu[k].strip() for k in lines)
        en = " ".join(eng[k].strip() for k in lines)
        prompts.append({"category": "translation", "turns": [TRANSLATION_PREFIX + de], "reference": [en],
                        "_source": {"corpus": "tatoeba_deu_eng", "line_numbers": [k + 1 for k in lines]}})
        used.extend(k + 1 for k in lines)
    # Identical sentences elsewhere in the file would leak the held-out text into training.
    held = {deu[k - 1].strip() for k in used}
    dup_deu = sorted({k + 1 for k in range(start) if deu[k].strip() in held})
    info = {
        "files": ["tatoeba_deu_eng/tatoeba.deu-eng.deu", "tatoeba_deu_eng/tatoeba.deu-eng.eng"],
        "note": "1-based line numbers; line N of .deu is aligned with line N of .eng. Skip these lines in both "
                "files (and any other line whose German or English text equals one of them).",
        "line_numbers": used,
        "deu": [deu[k - 1] for k in used],
        "eng": [eng[k - 1] for k in used],
        "duplicates_elsewhere_in_file": dup_deu,
    }
    return prompts, info


def load_articles(data: Path) -> list[dict]:
    arts = []
    with open(data / "wikitext2" / "articles.jsonl", encoding="utf-8") as f:
        for line in f:
            if line.strip():
                arts.append(json.loads(line))
    arts.sort(key=lambda a: a["id"])
    return arts


def raw_tokenized_spans(data: Path) -> dict[str, dict]:
    """Article id -> its line span in wikitext2/raw_tokenized/{valid,test}.txt (the n-th top-level heading
    ' = Title = ' of a split is article '<split>-<n>', as in articles.jsonl)."""
    spans: dict[str, dict] = {}
    for split in ("valid", "test"):
        path = data / "wikitext2" / "raw_tokenized" / f"{split}.txt"
        if not path.exists():
            continue
        lines = path.read_text(encoding="utf-8").split("\n")
        heads = [i for i, line in enumerate(lines) if re.fullmatch(r" = [^=].* = ", line)]
        for n, i in enumerate(heads):
            end = heads[n + 1] - 1 if n + 1 < len(heads) else len(lines) - 1
            while end > i and not lines[end].strip():
                end -= 1
            spans[f"{split}-{n:03d}"] = {"file": f"wikitext2/raw_tokenized/{split}.txt", "heading": lines[i],
                                         "first_line": i + 1, "last_line": end + 1}
    return spans


def build_summarization(arts: list[dict]) -> tuple[list[dict], list[dict]]:
    """One chunk per article; articles ranked by the <unk> density of their best chunk (only 2 of the 122
    articles have article-level unk_frac <= 0.03, so the filter is applied to the chunk instead)."""
    ranked = []
    for a in arts:
        cands = windows(article_sentences(a["text"]), *SUMMARY_WORDS, keep_paragraphs=True)
        cands = [c for c in cands if len(SUMMARIZATION_PREFIX) + len(c["text"]) <= MAX_PROMPT_CHARS]
        if not cands:
            continue
        best = min(cands, key=lambda c: (c["unk"] / c["words"], c["start"]))
        ranked.append((best["unk"] / best["words"], a["id"], a, best))
    ranked.sort(key=lambda r: (r[0], r[1]))
    prompts, used = [], []
    for density, _, a, c in ranked[:PER_CATEGORY]:
        prompts.append({"category": "summarization", "turns": [SUMMARIZATION_PREFIX + display(c["text"])],
                        "_source": {"corpus": "wikitext2", "article_id": a["id"], "title": a["title"]}})
        used.append({"id": a["id"], "split": a["split"], "title": a["title"], "used_for": "summarization",
                     "chunk_words": c["words"], "chunk_unk": c["unk"], "chunk_first_sentence": c["sentences"][0]})
    return prompts, used


def build_qa(data: Path, rng: random.Random) -> tuple[list[dict], dict]:
    items = json.loads((data / "webquestions" / "test.json").read_text(encoding="utf-8"))
    eligible = [
        (i, q) for i, q in enumerate(items)
        if q.get("qText", "").strip().endswith("?") and 1 <= len(q.get("answers", [])) <= 3
        and all(0 < len(x) <= 60 for x in q["answers"]) and 4 <= len(q["qText"].split()) <= 15
    ]
    chosen = sorted(rng.sample(eligible, PER_CATEGORY), key=lambda t: t[0])
    prompts, used = [], []
    for i, q in chosen:
        text = q["qText"].strip()
        text = text[0].upper() + text[1:]
        prompts.append({"category": "qa", "turns": [text], "reference": ["; ".join(q["answers"])],
                        "_source": {"corpus": "webquestions", "qId": q["qId"], "index": i}})
        used.append({"qId": q["qId"], "index": i, "qText": q["qText"], "answers": q["answers"]})
    info = {"file": "webquestions/test.json", "note": "index is the 0-based position in the JSON array",
            "items": used}
    return prompts, info


YEAR_RE = re.compile(r"\b(1[5-9]\d\d|20[0-2]\d)\b")
# Year-question answers must stand on their own ("It was the eighth time ..." needs the previous sentence).
PRONOUN_START = re.compile(r"(It|He|She|They|This|These|That|Those|Its|His|Her|Their|There)\b")


def definition_question(title: str, first_sentence: str) -> tuple[str, str] | None:
    """'According to the passages, what is "Kiss You"?' from a lead sentence that starts with the title."""
    base = re.sub(r"\s*\([^)]*\)$", "", title).strip()
    if UNK in base or not base or not base[0].isalnum():
        return None
    m = re.match(r"(?P<subj>(?:The |the )?\"?" + re.escape(base) + r"\"?)(?P<rest>.*)$", first_sentence)
    if not m:
        return None
    paren = re.match(r"^\s*\(([^)]*)\)", m.group("rest"))
    # "Tim Richmond (June 7, 1955 – August 13, 1989) was ...", "Hannah Dodd (born 27 April 1992) is ..."
    person = bool(paren and re.search(r"\bborn\b|\d{3,4}\s*–|–\s*\d{3,4}\s*$", paren.group(1)))
    rest = m.group("rest")[paren.end():] if paren else m.group("rest")  # skip "(born ...)" etc.
    rest = re.sub(r"^,[^,]*,", "", rest)                   # skip ", known as ...,"
    v = re.match(r"\s*(is|was|are|were)\s+(a|an|the|one|two|three|\d)\b", rest)
    if not v:
        return None
    subj = m.group("subj")
    if subj.startswith("The ") and not base.startswith("The "):
        subj = "the " + subj[4:]  # "The Battle of X was ..." -> "what was the Battle of X?"
    wh = "who" if person else "what"
    return f"According to the passages, {wh} {v.group(1)} {subj}?", first_sentence


def build_rag(arts: list[dict], exclude_ids: set[str], rng: random.Random) -> tuple[list[dict], list[dict]]:
    pool = []
    for a in arts:
        if a["id"] in exclude_ids or UNK in a["title"] or a["n_words"] < 400:
            continue
        sents = article_sentences(a["text"])
        cands = windows(sents, *PASSAGE_WORDS, keep_paragraphs=False)
        if not cands:
            continue
        cands.sort(key=lambda c: (c["unk"], c["start"]))
        lead = [c for c in cands if c["start"] == 0]
        definition = None
        if lead and lead[0]["sentences"][0].count(UNK) <= 1:
            definition = definition_question(a["title"], lead[0]["sentences"][0])
        year_cands = []
        for c in cands:
            for s in c["sentences"]:
                ys = YEAR_RE.findall(s)
                if UNK not in s and len(set(ys)) == 1 and 8 <= n_words(s) <= 45 and not PRONOUN_START.match(s) and \
                        sum(1 for t in c["sentences"] if ys[0] in t) == 1:
                    year_cands.append((c, ys[0], s))
        pool.append({"a": a, "cands": cands, "lead": lead[0] if lead else None, "definition": definition,
                     "years": year_cands, "min_unk": cands[0]["unk"] / cands[0]["words"]})
    # Gold articles: cleanest first; half use a definition question (lead passage), half a year question.
    pool.sort(key=lambda p: (p["min_unk"], p["a"]["id"]))
    def_pool = sorted((p for p in pool if p["definition"] and p["lead"]["unk"] <= 3),
                      key=lambda p: (p["definition"][1].count(UNK), p["lead"]["unk"], p["a"]["id"]))
    year_pool = [p for p in pool if p["years"]]
    gold: list[tuple[dict, str]] = []
    taken: set[str] = set()
    for k in range(PER_CATEGORY):
        source = def_pool if k % 2 == 0 else year_pool
        kind = "definition" if k % 2 == 0 else "year"
        p = next(p for p in source if p["a"]["id"] not in taken)
        taken.add(p["a"]["id"])
        gold.append((p, kind))
    gold_ids = [p["a"]["id"] for p, _ in gold]
    by_id = {p["a"]["id"]: p for p in pool}
    used_windows: set[tuple[str, int]] = set()

    prompts = []
    usage: dict[str, list] = {i: [] for i in gold_ids}
    for k, (p, kind) in enumerate(gold):
        aid = p["a"]["id"]
        if kind == "definition":
            gw = p["lead"]
            question, answer = p["definition"]
            key = re.sub(r"\s*\([^)]*\)$", "", p["a"]["title"])
        else:
            gw, year, answer = min((y for y in p["years"] if (aid, y[0]["start"]) not in used_windows),
                                   key=lambda y: (y[0]["unk"], y[0]["start"]))
            question = f"According to the passages, what happened in {year}?"
            key = year
        used_windows.add((aid, gw["start"]))
        # Two distractor passages from other gold articles (so no extra articles are consumed); they must not
        # contain the key (title or year), so the question is answerable from exactly one passage.
        others = [i for i in gold_ids if i != aid]
        rng.shuffle(others)
        distractors = []
        for oid in others:
            for c in by_id[oid]["cands"]:
                if (oid, c["start"]) in used_windows or key.lower() in c["text"].lower() or c["unk"] > 3:
                    continue
                if kind == "year" and YEAR_RE.search(c["text"]) and key in c["text"]:
                    continue
                distractors.append((oid, c))
                used_windows.add((oid, c["start"]))
                break
            if len(distractors) == 2:
                break
        assert len(distractors) == 2, aid
        passages = [(aid, gw, True)] + [(oid, c, False) for oid, c in distractors]
        rng.shuffle(passages)
        body = "\n".join(f"Passage {n}: {display(c['text'])}" for n, (_, c, _) in enumerate(passages, 1))
        turn = f"{RAG_PREFIX}{body}\n\nQuestion: {question}"
        gold_pos = next(n for n, (_, _, g) in enumerate(passages, 1) if g)
        prompts.append({"category": "rag", "turns": [turn], "reference": [display(answer)],
                        "_source": {"corpus": "wikitext2", "gold_article_id": aid, "gold_passage": gold_pos,
                                    "question_kind": kind,
                                    "passages": [{"article_id": i, "first_sentence": c["sentences"][0]}
                                                 for i, c, _ in passages]}})
        for i, c, g in passages:
            usage[i].append({"prompt": k, "gold": g, "first_sentence": c["sentences"][0], "words": c["words"]})
    used = []
    for i in gold_ids:
        a = by_id[i]["a"]
        used.append({"id": a["id"], "split": a["split"], "title": a["title"], "used_for": "rag",
                     "passages": usage[i]})
    return prompts, used


# ---------------------------------------------------------------------------------------------- main

def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data-dir", type=Path, default=Path("/work/shared/data/train"))
    ap.add_argument("--out-dir", type=Path, default=REPO_ROOT / "benchmarks" / "prompts")
    args = ap.parse_args(argv)
    data: Path = args.data_dir

    translation, tatoeba_info = build_translation(data, random.Random(SEED + 1))
    arts = load_articles(data)
    summarization, wt_sum = build_summarization(arts)
    qa, wq_info = build_qa(data, random.Random(SEED + 3))
    rag, wt_rag = build_rag(arts, {u["id"] for u in wt_sum}, random.Random(SEED + 4))

    prompts = translation + summarization + qa + rag
    records = []
    for n, p in enumerate(prompts):
        rec = {"question_id": FIRST_QUESTION_ID + n, "category": p["category"], "turns": p["turns"]}
        if "reference" in p:
            rec["reference"] = p["reference"]
        assert len(rec["turns"]) == 1 and len(rec["turns"][0]) <= MAX_PROMPT_CHARS, (rec["question_id"],
                                                                                      len(rec["turns"][0]))
        assert UNK not in rec["turns"][0]
        records.append(rec)
        p["question_id"] = rec["question_id"]

    def qids(cat: str, pred=lambda p: True) -> list[int]:
        return [p["question_id"] for p in prompts if p["category"] == cat and pred(p)]

    spans = raw_tokenized_spans(data)
    for u in wt_sum + wt_rag:
        if u["id"] in spans:
            u["raw_tokenized"] = spans[u["id"]]
    for u in wt_sum:
        u["question_ids"] = qids("summarization", lambda p, i=u["id"]: p["_source"]["article_id"] == i)
    for u in wt_rag:
        u["question_ids"] = qids("rag", lambda p, i=u["id"]: any(x["article_id"] == i
                                                                 for x in p["_source"]["passages"]))
        for x in u["passages"]:
            x["question_id"] = rag[x.pop("prompt")]["question_id"]

    exclude = {
        "description": "Source items used by benchmarks/prompts/other_kinds.jsonl (held-out benchmark). "
                       "Drafter-training data builders must skip every item listed here.",
        "generated_by": "python3 scripts/make_other_kinds.py",
        "seed": SEED,
        "data_dir": str(data),
        "rule": "Never train drafters or tune methods on these prompts. Skip: the tatoeba line numbers (both "
                "files), every listed wikitext2 article as a whole (in articles.jsonl by id, and in "
                "wikitext2/raw_tokenized/{valid,test}.txt the 1-based line span given as raw_tokenized), and the "
                "listed webquestions items (match on qId or qText).",
        "tatoeba_deu_eng": tatoeba_info,
        "wikitext2": {
            "file": "wikitext2/articles.jsonl",
            "exclude_whole_articles": True,
            "article_ids": sorted(u["id"] for u in wt_sum + wt_rag),
            "titles": [u["title"] for u in sorted(wt_sum + wt_rag, key=lambda u: u["id"])],
            "articles": wt_sum + wt_rag,
        },
        "webquestions": wq_info,
        "prompts": [{"question_id": p["question_id"], "category": p["category"], **p["_source"]}
                    for p in prompts],
    }

    out: Path = args.out_dir
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "other_kinds.jsonl", "w", encoding="utf-8", newline="\n") as f:
        for rec in records:
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")
    with open(out / "other_kinds.exclude.json", "w", encoding="utf-8", newline="\n") as f:
        json.dump(exclude, f, ensure_ascii=False, indent=1)
        f.write("\n")
    lic = out / "licenses"
    lic.mkdir(exist_ok=True)
    for src, dst in LICENSE_FILES:
        shutil.copyfile(data / src, lic / dst)
    counts = {}
    for r in records:
        counts[r["category"]] = counts.get(r["category"], 0) + 1
    print(f"wrote {len(records)} prompts to {out / 'other_kinds.jsonl'} {counts}", file=sys.stderr)
    print(f"wrote exclusion list to {out / 'other_kinds.exclude.json'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
