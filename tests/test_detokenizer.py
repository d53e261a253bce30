"""Incremental detokenization equals decoding all the ids at once, whatever the chunks, and costs O(n)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specdec import SamplingParams
from specdec.engine.detokenizer import IncrementalDetokenizer
from specdec.engine.stopping import StopChecker
from tiny_models import make_tokenizer


def sentencepiece_like():
    """A Llama-style tokenizer: Metaspace words, byte fallback, and a decoder that strips the first token's
    leading space (the position-dependent quirk the decode window must cancel out)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    pieces = ["<pad>", "<bos>", "<eos>", *[f"<0x{b:02X}>" for b in range(256)],
              "\u2581", "\u2581the", "\u2581cat", "s", "at", "\u2581h", "ello", "\u2581\u2581", "e", "l", "o", "t", "a"]
    vocab = {p: i for i, p in enumerate(pieces)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], byte_fallback=True, unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first")
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>")


TOKENIZERS = {"byte_level": make_tokenizer(), "sentencepiece_like": sentencepiece_like()}


def incremental(tokenizer, ids: list[int], chunks: list[int]) -> str:
    d = IncrementalDetokenizer(tokenizer)
    pieces, i = [], 0
    for size in chunks:
        if i >= len(ids):
            break
        pieces.append(d.add(ids[i : i + size]))
        i += size
    pieces.append(d.add(ids[i:]))
    pieces.append(d.flush())
    assert "".join(pieces) == d.text  # the pieces are what was appended: text is append-only
    return d.text


def units(tok) -> st.SearchStrategy[list[int]]:
    """Token ids a model emits: for the byte-level tokenizer any ids (every byte is a token and its decoder
    keeps valid characters whole); for byte fallback, pieces and whole characters' byte tokens. (Byte fallback
    decodes a run of byte tokens that is not valid UTF-8 as one U+FFFD per byte, even the valid ones before
    the bad byte: there a full decode loses text that the incremental one keeps.)"""
    if tok is TOKENIZERS["byte_level"]:
        return st.lists(st.integers(0, len(tok) - 1), max_size=40)
    pieces = st.sampled_from([i for t, i in tok.get_vocab().items() if not t.startswith("<0x")])
    char_bytes = st.characters(codec="utf-8").map(
        lambda c: [tok.convert_tokens_to_ids(f"<0x{b:02X}>") for b in c.encode("utf-8")])
    unit = st.one_of(pieces.map(lambda i: [i]), char_bytes)
    return st.lists(unit, max_size=30).map(lambda us: [i for u in us for i in u])


@pytest.mark.parametrize("name", sorted(TOKENIZERS))
@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_incremental_text_equals_a_full_decode(name, data):
    tok = TOKENIZERS[name]
    ids = data.draw(units(tok))
    chunks = data.draw(st.lists(st.integers(1, 4), max_size=40))
    assert incremental(tok, ids, chunks) == tok.decode(ids, skip_special_tokens=True)


@pytest.mark.parametrize("name", sorted(TOKENIZERS))
def test_real_text_with_multibyte_characters(name):
    tok = TOKENIZERS[name]
    text = "the cats hello  \u20ac \u4e2d\u6587 \U0001f600 at the"
    ids = tok(text, add_special_tokens=False).input_ids
    for size in (1, 2, 5):
        assert incremental(tok, ids, [size] * len(ids)) == tok.decode(ids, skip_special_tokens=True)


class CountingTokenizer:
    """Wraps a tokenizer and counts the ids decoded in all."""

    def __init__(self, tok) -> None:
        self.tok, self.decoded = tok, 0

    def decode(self, ids, **kwargs):
        self.decoded += len(ids)
        return self.tok.decode(ids, **kwargs)


@pytest.mark.parametrize("stop", [[], ["zzz", "never"]])
def test_text_and_stop_checks_decode_a_linear_number_of_ids(stop):
    """Issue 24, item 7: before, every step decoded the whole output again when stop strings were set
    (n^2/2 ids decoded over a request); now each token decodes a short window."""
    tok = CountingTokenizer(make_tokenizer())
    n = 2000
    ids = make_tokenizer()("ab cd " * (n // 6 + 1), add_special_tokens=False).input_ids[:n]
    checker = StopChecker(tok, SamplingParams(max_tokens=n, stop=stop), eos_token_ids=[2])
    for i in range(0, n, 3):
        checker.extend(ids[i : i + 3])
    assert checker.finish is not None and checker.finish.reason == "length"
    assert checker.text() == make_tokenizer().decode(ids)
    assert tok.decoded < 10 * n  # a full re-decode per step would be about n^2 / 6 = 666,000
