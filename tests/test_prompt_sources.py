"""Training prompt sources: writing tasks from Topical-Chat's news stories, and keeping some kinds only."""

from __future__ import annotations

import gzip
import json
import random

import pytest
from specdec.training import self_distill
from specdec.training.prompt_sources import (
    WRITING_TASKS, Exclusions, TrainPrompt, _wiki, _writing, headline_from_url, wiki_chunks,
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
