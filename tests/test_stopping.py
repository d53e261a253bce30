"""StopChecker: where an output ends when tokens arrive several at a time (a step's accepted draft)."""

from __future__ import annotations

import pytest

from specdec import SamplingParams
from specdec.engine.stopping import StopChecker
from tiny_models import make_tokenizer

EOS = 2


@pytest.fixture(scope="module")
def tok():
    return make_tokenizer()


def ids_of(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False).input_ids


def checker(tok, **params) -> StopChecker:
    return StopChecker(tok, SamplingParams(**{"max_tokens": 100, **params}), [EOS])


def test_max_tokens_cuts_a_chunk(tok):
    c = checker(tok, max_tokens=4)
    assert c.extend(ids_of(tok, "ab")) == ids_of(tok, "ab") and c.finish is None
    assert c.extend(ids_of(tok, "cdef")) == ids_of(tok, "cd")
    assert (c.finish.reason, c.finish.stop_reason) == ("length", None)
    assert c.output == ids_of(tok, "abcd") and c.text() == "abcd"
    assert c.extend(ids_of(tok, "g")) == []  # nothing is taken after the finish
    assert len(c.output) == 4


def test_eos_in_the_middle_of_a_chunk(tok):
    c = checker(tok)
    chunk = [*ids_of(tok, "hi"), EOS, *ids_of(tok, "there")]
    assert c.extend(chunk) == [*ids_of(tok, "hi"), EOS]
    assert (c.finish.reason, c.finish.stop_reason) == ("stop", EOS)
    assert c.output[-1] == EOS  # kept in token ids, as vLLM does
    assert c.text() == "hi"


def test_ignore_eos(tok):
    c = checker(tok, ignore_eos=True, max_tokens=5)
    c.extend([*ids_of(tok, "hi"), EOS, *ids_of(tok, "there")])
    assert c.finish.reason == "length" and c.output[2] == EOS


def test_stop_token_ids_even_with_ignore_eos(tok):
    stop = ids_of(tok, "x")[0]
    c = checker(tok, ignore_eos=True, stop_token_ids=[stop])
    assert c.extend(ids_of(tok, "abxcd")) == ids_of(tok, "abx")
    assert (c.finish.reason, c.finish.stop_reason) == ("stop", stop)
    assert c.text() == "ab"  # a stop token that is an ordinary token is left out of the text too


def test_stop_string_inside_a_chunk(tok):
    c = checker(tok, stop=["lo w"])
    taken = c.extend(ids_of(tok, "hello world"))
    assert taken == ids_of(tok, "hello w")  # ends with the token that completed the stop string
    assert c.text() == "hel"
    assert (c.finish.reason, c.finish.stop_reason) == ("stop", "lo w")


def test_stop_string_across_chunks(tok):
    c = checker(tok, stop=["END"])
    c.extend(ids_of(tok, "abcE"))
    c.extend(ids_of(tok, "N"))
    assert c.finish is None
    c.extend(ids_of(tok, "Dxyz"))
    assert c.text() == "abc" and c.output == ids_of(tok, "abcEND")


def test_the_earliest_stop_string_wins(tok):
    c = checker(tok, stop=["world", "lo"])
    c.extend(ids_of(tok, "hello world"))
    assert c.finish.stop_reason == "lo" and c.text() == "hel"


def test_stop_string_completed_by_the_last_allowed_token_is_a_stop(tok):
    c = checker(tok, stop=["cd"], max_tokens=4)
    c.extend(ids_of(tok, "abcdef"))
    assert (c.finish.reason, c.text()) == ("stop", "ab")


@pytest.mark.parametrize("stop", ["\u20ac", "b\u20ac", "\u20acx", "\u4e2d\u6587"])
@pytest.mark.parametrize("chunk", [1, 2, 3])
def test_multibyte_stop_strings(tok, stop, chunk):
    """A character split over byte tokens decodes as U+FFFD until its last byte arrives: the stop string
    must still be found (the text before it changes as well as the text after it)."""
    text = "ab\u20acx\u4e2d\u6587yz"
    ids = ids_of(tok, text)
    c = checker(tok, stop=[stop])
    for i in range(0, len(ids), chunk):
        c.extend(ids[i : i + chunk])
    assert c.finish is not None and c.finish.stop_reason == stop
    assert c.text() == text[: text.index(stop)]
    assert tok.decode(c.output).endswith(stop)  # the output ends with the token that completed it


def test_special_tokens_are_left_out_of_the_text(tok):
    c = checker(tok)
    c.extend([*ids_of(tok, "a"), 0, *ids_of(tok, "b")])  # 0 is <pad>
    assert c.text() == "ab" and len(c.output) == 3
