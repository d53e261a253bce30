"""Training prompt sources: writing tasks from Topical-Chat's news stories, keeping some kinds only, and never
a held-out benchmark item (other_kinds.exclude.json, held_out.exclude.json)."""

from __future__ import annotations

import gzip
import json
import random
import re
from pathlib import Path

import pytest
from specdec.training import prompt_sources, self_distill
from specdec.training.prompt_sources import (
    DEFAULT_DATA_DIR, DEFAULT_EXCLUDE, WRITING_TASKS, Exclusions, TrainPrompt, _gsm8k, _topical_chat, _wiki, _writing,
    build_prompts, headline_from_url, wiki_chunks,
)
from specdec.training.self_distill import DistillSettings, generate_data, read_data, read_samples


def test_headline_is_the_wordiest_path_segment():
    url = "https://www.washingtonpost.com/news/early-lead/wp/2018/03/26/jets-rescind-pretty-high-offer/"
    assert headline_from_url(url) == "Jets rescind pretty high offer"
    story = ("https://www.washingtonpost.com/opinions/what-philip-roth-wanted-us-to-notice/2018/05/24/"
             "5d880cac-5f4f-11e8-a4a4-c070ef53f315_story.html")
    assert headline_from_url(story) == "What philip roth wanted us to notice"
    assert headline_from_url("https://example.com/2018/05/24/") is None


def test_writing_prompts_use_each_story_twice(tmp_path):
    root = tmp_path / "train"
    (root / "topical_chat").mkdir(parents=True)
    convs = {f"c{i}": {"article_url": f"https://x.com/2018/0{i}/01/story-number-{'one two three'.split()[i]}-here/",
                       "content": []} for i in range(3)}
    convs["dup"] = dict(convs["c0"])  # two conversations about one story: one story
    for name in ("valid_freq.json", "valid_rare.json", "test_freq.json", "test_rare.json"):
        (root / "topical_chat" / name).write_text(json.dumps(convs if name == "valid_freq.json" else {}))
    ex = Exclusions(frozenset(), frozenset(), frozenset(), frozenset())
    prompts = _writing(root, ex, random.Random(0))
    assert len(prompts) == 6 and len({p.id for p in prompts}) == 6
    assert all(p.kind == "writing" and len(p.turns) == 1 for p in prompts)
    firsts = {task.split("{h}")[0] for task in WRITING_TASKS}
    assert all(any(p.turns[0].startswith(f) for f in firsts) for p in prompts)
    assert sum("Story number two here" in p.turns[0] for p in prompts) == 2


def test_generate_data_keeps_the_asked_kinds(zoo, tmp_path, monkeypatch):
    fake = [TrainPrompt(f"p{i}", ["chat", "writing", "math"][i % 3], (f"word {i}",)) for i in range(9)]
    monkeypatch.setattr(self_distill, "build_prompts", lambda *a, **k: list(fake))
    settings = DistillSettings(target=zoo.path("llama"), max_new_tokens=3)
    generate_data(settings, tmp_path / "d", num_prompts=2, progress=False, kinds=["writing", "math"])
    assert [s.id for s in read_samples(tmp_path / "d")] == ["p1", "p2"]
    with pytest.raises(ValueError, match="no prompts of kind"):
        generate_data(settings, tmp_path / "d", progress=False, kinds=["poetry"])


def test_wiki_chunks_are_whole_paragraphs_without_headings_and_unk():
    text = "\n\n".join(["First para " + "word " * 60, " = Heading = ", "Second <unk> para " + "w " * 80,
                       "Third " + "x " * 500])
    chunks = wiki_chunks(text, lo=50, hi=200)
    assert chunks[0].startswith("First para") and "Second ___ para" in chunks[0]
    assert "Heading" not in " ".join(chunks) and "<unk>" not in " ".join(chunks)
    assert chunks[1].startswith("Third") and len(chunks[1].split()) == 200


def test_wiki_prompts_skip_held_out_articles(tmp_path):
    root = tmp_path / "train"
    (root / "wikitext2").mkdir(parents=True)
    body = "\n\n".join(f"In {1900 + i} something happened " + "word " * 150 for i in range(4))
    rows = [{"id": f"a{i}", "title": f"Topic {i}", "text": body} for i in range(4)]
    (root / "wikitext2" / "articles.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    ex = Exclusions(frozenset(), frozenset(), frozenset({"a3"}), frozenset())
    prompts = _wiki(root, ex, random.Random(0))
    assert {p.id.split("-")[1] for p in prompts} == {"a0", "a1", "a2"}
    assert {p.kind for p in prompts} == {"summarization", "rag"}
    rag = [p.turns[0] for p in prompts if p.kind == "rag"]
    assert rag and all(t.count("Passage ") == 3 and "\n\nQuestion: " in t for t in rag)


def test_read_samples_reads_a_gzipped_data_set(tmp_path):
    rows = [{"id": "a", "kind": "chat", "prompt_ids": [1, 2], "response_ids": [3]},
            {"id": "b", "kind": "rag", "prompt_ids": [4], "response_ids": [5, 6]}]
    with gzip.open(tmp_path / "samples.jsonl.gz", "wt", encoding="utf-8") as f:
        f.write("".join(json.dumps(r) + "\n" for r in rows) + '{"id": "cut')  # an interrupted last line
    assert [(s.id, s.response_ids) for s in read_samples(tmp_path)] == [("a", [3]), ("b", [5, 6])]
    with pytest.raises(FileNotFoundError, match="data generate"):
        read_samples(tmp_path / "missing")
    with pytest.raises(ValueError, match="unpack it first"):  # generating here would hide the packed set
        generate_data(DistillSettings(target="unused"), tmp_path, progress=False)


def test_read_data_joins_directories_and_skips_repeated_prompts(tmp_path):
    def write(name, rows):
        (tmp_path / name).mkdir()
        (tmp_path / name / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))

    def row(id_, prompt):
        return {"id": id_, "kind": "chat", "prompt_ids": prompt, "response_ids": [9]}

    write("a", [row("a1", [1]), row("a2", [2])])
    write("b", [row("b1", [2]), row("b2", [3]), row("b3", [3])])  # [2] is a's; b itself is read as it is
    assert [s.id for s in read_data(str(tmp_path / "a"))] == ["a1", "a2"]
    assert [s.id for s in read_data(f"{tmp_path / 'a'},{tmp_path / 'b'}")] == ["a1", "a2", "b2", "b3"]
    write("c", [row("a1", [7])])
    with pytest.raises(ValueError, match="occurs in two"):
        read_data(f"{tmp_path / 'a'},{tmp_path / 'c'}")


# ---- held-out benchmark items never reach training ----

PROMPTS_DIR = Path(__file__).resolve().parents[1] / "benchmarks" / "prompts"


def test_default_exclusions_are_both_benchmark_lists():
    assert [p.name for p in DEFAULT_EXCLUDE] == ["other_kinds.exclude.json", "held_out.exclude.json"]
    assert all(p.parent == PROMPTS_DIR and p.is_file() for p in DEFAULT_EXCLUDE)
    ex = Exclusions.load_all(DEFAULT_EXCLUDE)
    held = json.loads((PROMPTS_DIR / "held_out.exclude.json").read_text())
    assert ex.topical_chat_ids == frozenset(held["topical_chat"]["conversation_ids"]) and ex.topical_chat_ids
    assert ex.gsm8k_indices == frozenset(held["gsm8k_train"]["indices"]) and ex.gsm8k_indices
    assert set(held["wikitext2"]["article_ids"]) <= ex.wikitext_ids  # other_kinds' articles, already excluded
    assert set(held["tatoeba_deu_eng"]["line_numbers"]) <= ex.tatoeba_lines
    assert ex.webquestions  # other_kinds' items are kept in the union


def test_a_missing_or_foreign_exclusion_list_is_an_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="exclusion list not found"):
        build_prompts(tmp_path, exclude=[DEFAULT_EXCLUDE[0], tmp_path / "missing.json"])
    with pytest.raises(FileNotFoundError, match="exclusion list not found"):
        build_prompts(tmp_path, exclude=None)
    (tmp_path / "other.json").write_text(json.dumps({"items": [1]}))
    with pytest.raises(ValueError, match="not an exclusion list"):
        Exclusions.load(tmp_path / "other.json")


def _fake_corpora(root: Path) -> None:
    (root / "topical_chat").mkdir(parents=True)
    convs = {f"c{i}": {"article_url": f"https://x.com/2018/01/0{i}/story-number-{w}-here/",
                       "content": [{"message": f"{w} message {k}", "agent": f"agent_{k % 2 + 1}"} for k in range(8)]}
             for i, w in enumerate(["one", "two", "three", "four"])}
    convs["c4"] = {**convs["c3"], "content": convs["c0"]["content"]}  # another conversation on c3's story
    for name in prompt_sources.TOPICAL_CHAT_FILES:
        (root / "topical_chat" / name).write_text(json.dumps(convs if name == "valid_freq.json" else {}))
    (root / "gsm8k_train").mkdir()
    (root / "gsm8k_train" / "train.jsonl").write_text(
        "".join(json.dumps({"question": f"What is {i} + {i}?", "answer": f"#### {2 * i}"}) + "\n" for i in range(6)))


def _exclusion_files(tmp_path: Path) -> tuple[Path, Path]:
    other = tmp_path / "other.exclude.json"
    other.write_text(json.dumps({"tatoeba_deu_eng": {"line_numbers": []}, "wikitext2": {"article_ids": []},
                                 "webquestions": {"items": []}}))
    held = tmp_path / "held.exclude.json"
    held.write_text(json.dumps({"topical_chat": {"conversation_ids": ["c1", "c3"], "article_urls": []},
                                "gsm8k_train": {"indices": [0, 4]}}))
    return other, held


def test_held_out_conversations_questions_and_stories_are_skipped(tmp_path, monkeypatch):
    root = tmp_path / "train"
    _fake_corpora(root)
    other, held = _exclusion_files(tmp_path)
    ex = Exclusions.load_all([other, held])
    assert ex.topical_chat_ids == {"c1", "c3"} and ex.gsm8k_indices == {0, 4}

    assert [p and p.id for p in _gsm8k(root, ex, random.Random(0))] == [
        None, "gsm8k-1", "gsm8k-2", "gsm8k-3", None, "gsm8k-5"]
    chats = _topical_chat(root, ex, random.Random(0))
    assert [p and p.id for p in chats] == ["topical-c0", None, "topical-c2", None, "topical-c4"]
    # c4 is not held out: it is kept, but the story c3 (held out) talks about gets no writing task.
    writing = [p for p in _writing(root, ex, random.Random(0)) if p is not None]
    assert {p.id.rsplit("-", 1)[0] for p in writing} == {"writing-0", "writing-2"}  # stories of c0 and c2
    assert not any("number two" in p.turns[0].lower() or "number four" in p.turns[0].lower() for p in writing)

    # Holding items out changes no random draw: the rest is what the build gave before, in the same order.
    monkeypatch.setattr(prompt_sources, "SOURCES", {k: prompt_sources.SOURCES[k] for k in ("gsm8k", "topical_chat",
                                                                                       "writing")})
    before = build_prompts(root, exclude=other, seed=3)
    after = build_prompts(root, exclude=[other, held], seed=3)
    dropped = {"gsm8k-0", "gsm8k-4", "topical-c1", "topical-c3", "writing-1-0", "writing-1-1", "writing-3-0",
               "writing-3-1"}
    assert {p.id for p in before} - {p.id for p in after} == dropped
    for kind in ("math", "chat", "writing"):
        assert [p for p in after if p.kind == kind] == [p for p in before if p.kind == kind and p.id not in dropped]


def _held_out_prompts() -> list[dict]:
    return [json.loads(line) for line in (PROMPTS_DIR / "held_out.jsonl").read_text().splitlines() if line.strip()]


@pytest.mark.skipif(not (DEFAULT_DATA_DIR / "topical_chat").is_dir(), reason="../shared/data/train not present")
def test_no_held_out_item_leaks_into_the_real_training_prompts():
    prompts = build_prompts()
    ids = {p.id for p in prompts}
    held = json.loads((PROMPTS_DIR / "held_out.exclude.json").read_text())
    assert not ids & {f"topical-{c}" for c in held["topical_chat"]["conversation_ids"]}
    assert not ids & {f"gsm8k-{i}" for i in held["gsm8k_train"]["indices"]}
    assert not any(p.id.startswith(("wiki-", "wikirag-")) and p.id.split("-", 1)[1].rsplit("-", 1)[0]
                   in set(held["wikitext2"]["article_ids"]) for p in prompts)
    # The texts themselves: no held-out question, chat message, sentence or passage opening occurs in any
    # training prompt (turns and replayed answers).
    assert not _leaks(prompts, held)
    stories = {headline_from_url(u) for u in held["topical_chat"]["article_urls"]} - {None}
    assert stories and not any(h in t for p in prompts if p.kind == "writing" for t in p.turns for h in stories)


def _leaks(prompts: list[TrainPrompt], held: dict) -> list[str]:
    """Held-out texts (questions, chat messages, German sentences, paragraph and passage openings) found in the
    training prompts' turns or replayed answers."""
    def norm(text: str) -> str:  # the benchmark's WikiText cleaning: "5 – 6" -> "5–6", one space
        return re.sub(r"\s+", " ", re.sub(r"(\d) – (\d)", r"\1–\2", text))

    haystack = "\x00".join(norm(t) for p in prompts for t in p.turns + p.answers)
    needles = set()
    for q in _held_out_prompts():
        if q["category"] == "math":
            needles.add(q["turns"][0])
        elif q["category"] == "chat":
            needles.update(t for t in q["turns"] + q["answers"] if len(t) >= 40)
        elif q["category"] in ("summarization", "rag"):
            body = q["turns"][0].split("\n\n", 1)[1].rsplit("\n\nQuestion: ", 1)[0]
            needles.update(re.sub(r"^Passage \d+: ", "", par)[:80] for par in body.split("\n") if len(par) >= 120)
    needles.update(t for t in held["tatoeba_deu_eng"]["deu"] if len(t) >= 30)
    assert len(needles) > 100
    return sorted(n for n in map(norm, needles) if n in haystack)


@pytest.mark.skipif(not (DEFAULT_DATA_DIR / "wikitext2").is_dir(), reason="../shared/data/train not present")
def test_long_prompts_are_opt_in_long_and_never_held_out():
    from specdec.training.long_prompts import CODE_MAX_CHARS, CODE_MIN_CHARS, LONG_SOURCES, MAX_WORDS, MIN_WORDS

    short = build_prompts()
    both = build_prompts(long=True)
    assert not any(p.id.startswith("long") for p in short)  # the default list does not change
    long = [p for p in both if p.id.startswith("long")]
    kinds = {p.id.split("-")[0]: p.kind for p in long}
    assert kinds == {"longwiki": "summarization", "longrust": "summarization", "longrag": "rag", "longchat": "chat",
                     "longwiki2": "summarization", "longrust2": "summarization", "longpyref": "summarization",
                     "longcode": "code"}
    articles = [p for p in long if p.id.startswith(("longwiki", "longrust", "longpyref"))]
    assert all(min(MIN_WORDS, 400) <= len(p.turns[0].split()) <= MAX_WORDS + 10 for p in articles)
    assert all(CODE_MIN_CHARS <= len(p.turns[0]) <= CODE_MAX_CHARS + 4000 for p in long if p.kind == "code")
    assert len(ids := [p.id for p in long]) == len(set(ids))
    rag = [p for p in long if p.id.startswith("longrag")]
    assert all(5 <= len(re.findall(r"^Passage \d+: ", p.turns[0], re.M)) <= 8 for p in rag)
    assert all(len(p.turns) >= 7 and len(p.answers) == len(p.turns) - 1 for p in long if p.kind == "chat")
    held = json.loads((PROMPTS_DIR / "held_out.exclude.json").read_text())
    other = json.loads((PROMPTS_DIR / "other_kinds.exclude.json").read_text())
    ids = {p.id for p in long}
    assert not ids & {f"longchat-{c}" for c in held["topical_chat"]["conversation_ids"]}
    held_articles = set(other["wikitext2"]["article_ids"]) | set(held["wikitext2"]["article_ids"])
    assert not any(p.id.split("-", 1)[1].rsplit("-", 1)[0] in held_articles for p in long if p.id.startswith("longrag"))
    assert not ids & {f"longwiki-{a}" for a in held_articles}
    assert not _leaks(long, held)
    # the first three long sources' prompts do not change with the later ones (data sets resume by prompt id)
    first = dict(list(LONG_SOURCES.items())[:3])
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("specdec.training.long_prompts.LONG_SOURCES", first)
        before = {p.id: p.turns for p in build_prompts(long=True) if p.id.startswith("long")}
    assert all(dict((p.id, p.turns) for p in long)[i] == turns for i, turns in before.items())


def test_generate_data_keeps_prompts_of_the_asked_lengths(zoo, tmp_path, monkeypatch):
    fake = [TrainPrompt(f"p{i}", "chat", (" ".join(["word"] * (4 + 20 * i)),)) for i in range(4)]
    monkeypatch.setattr(self_distill, "build_prompts", lambda *a, **k: list(fake))
    settings = DistillSettings(target=zoo.path("llama"), max_new_tokens=2)
    from specdec.bench.prompts import render_prompt
    from specdec.models.loading import load_tokenizer

    lengths = [len(render_prompt(load_tokenizer(zoo.path("llama")), p.turns, p.answers)) for p in fake]
    assert lengths == sorted(lengths) and lengths[1] < lengths[2]
    generate_data(settings, tmp_path / "d", progress=False, min_prompt_tokens=lengths[2])
    kept = read_samples(tmp_path / "d")
    assert [s.id for s in kept] == ["p2", "p3"]
