"""GGUF block decoding (Q8_0, Q5_0, Q4_K, Q6_K) against the `gguf` package's dequantization, exactly: on
random blocks, and on the default model's own file."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

from specdec.quantization.gguf_blocks import SUPPORTED, decode_blocks

SIZES = {"Q8_0": 34, "Q5_0": 22, "Q4_K": 144, "Q6_K": 210}
# where each block's fp16 scales sit (bytes), set to finite values so that random bytes make valid blocks
HALVES = {"Q8_0": [0], "Q5_0": [0], "Q4_K": [0, 2], "Q6_K": [208]}


def random_tensor(kind: str, rows: int, blocks: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    data = rng.integers(0, 256, size=(rows, blocks, SIZES[kind]), dtype=np.uint8)
    for at in HALVES[kind]:
        half = (rng.standard_normal((rows, blocks)) * 0.02).astype(np.float16)
        data[..., at : at + 2] = half.view(np.uint8).reshape(rows, blocks, 2)
    if kind == "Q8_0":  # llama.cpp never writes -128 (and the kernel's sign trick cannot negate it)
        q = data[..., 2:].view(np.int8)
        q[q == -128] = -127
    return data.reshape(rows, blocks * SIZES[kind])


@pytest.mark.parametrize("kind", SUPPORTED)
def test_random_blocks_decode_exactly_as_gguf_dequantizes(kind):
    data = random_tensor(kind, rows=9, blocks=3)
    ref = dequantize(data, GGMLQuantizationType[kind])
    ours = decode_blocks(data, kind).dequantize().numpy()
    assert ours.shape == ref.shape
    assert np.array_equal(ours, ref)


def test_unsupported_types_and_broken_rows_are_clear_errors():
    with pytest.raises(ValueError, match="not supported.*Q8_0"):
        decode_blocks(np.zeros((2, 18), np.uint8), "Q4_0")
    with pytest.raises(ValueError, match="whole blocks"):
        decode_blocks(np.zeros((2, 35), np.uint8), "Q8_0")
    data = random_tensor("Q8_0", 2, 1)
    data[0, 2] = 0x80  # the quant -128
    with pytest.raises(ValueError, match="-128"):
        decode_blocks(data, "Q8_0")


def test_the_default_models_tensors_decode_exactly():
    """Rows of one tensor of each type the default model's Q4_K_M file holds (read by our tensor table,
    which test_tensor_table_agrees_with_gguf_reader checks)."""
    from specdec.models.loading import resolve_model_path
    from specdec.quantization.gguf_file import read_tensors

    path = resolve_model_path("gemma-3-270m")
    tensors = read_tensors(path)
    seen = {}
    for t in tensors.values():
        seen.setdefault(t.tensor_type.name, t)
    assert set(SUPPORTED) <= set(seen)
    for kind in SUPPORTED:
        rows = seen[kind].data[:16]
        assert np.array_equal(decode_blocks(rows, kind).dequantize().numpy(), dequantize(rows, seen[kind].tensor_type))


def test_tensor_table_agrees_with_gguf_reader(tmp_path):
    """A small file written by gguf's own writer, with metadata arrays of strings (which our reader skips)."""
    from gguf import GGUFReader, GGUFWriter

    from specdec.quantization.gguf_file import read_tensors

    path = tmp_path / "t.gguf"
    writer = GGUFWriter(str(path), "llama")
    writer.add_array("tokenizer.ggml.tokens", ["a", "bc", "déf"] * 50)
    writer.add_array("tokenizer.ggml.scores", [0.5] * 150)
    data = {"q8": random_tensor("Q8_0", 4, 2), "q4k": random_tensor("Q4_K", 3, 1)}
    writer.add_tensor("q8", data["q8"], raw_dtype=GGMLQuantizationType.Q8_0)
    writer.add_tensor("q4k", data["q4k"], raw_dtype=GGMLQuantizationType.Q4_K)
    writer.add_tensor("norm", np.arange(64, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    ours = read_tensors(path)
    for t in GGUFReader(str(path)).tensors:
        assert ours[t.name].tensor_type == t.tensor_type
        assert tuple(ours[t.name].shape) == tuple(int(d) for d in t.shape)
        assert np.array_equal(ours[t.name].data.reshape(-1), np.asarray(t.data).view(np.uint8).reshape(-1))
    assert np.array_equal(ours["q8"].data, data["q8"])
