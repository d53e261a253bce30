"""The default model on its GGUF file's own quantized tensors (Q4_K_M: Q5_0, Q8_0, Q4_K, Q6_K):
speculative greedy output equals plain output of the same quantized model, with drafts really verified."""

from __future__ import annotations

import pytest

from specdec import LLM, SamplingParams
from specdec.quantization import QuantizedLinear

pytestmark = pytest.mark.slow

PROMPTS = [
    'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n',
    "List the days of the week: Monday, Tuesday,",
]
GREEDY = SamplingParams(temperature=0, max_tokens=40)


# int4 and int8 run the kernels of the GGUF's formats (tests on tiny models); w8a8_int8 its own kernel
@pytest.mark.parametrize("mode", ["gguf", "w8a8_int8"])
def test_speculative_equals_plain_on_the_quantized_default_model(mode):
    plain = LLM(quantization=mode)
    decoder = plain.model.decoder
    assert isinstance(decoder.layers[0].o, QuantizedLinear) and decoder.quantized_head is not None
    if mode == "gguf":  # the file's own formats, not a requantization
        formats = {getattr(layer, n).weight.format for layer in decoder.layers for n in ("qkv", "o", "gate_up", "down")}
        assert {"Q5_0", "Q4_K", "Q6_K"} <= {f for fs in formats for f in fs.split("+")}
        assert decoder.quantized_head.format == "Q8_0"
    expected = [o.outputs[0].token_ids for o in plain.generate(PROMPTS, GREEDY)]
    spec = LLM(loaded=plain.model, speculative_config={"method": "ngram", "num_speculative_tokens": 4})
    assert [o.outputs[0].token_ids for o in spec.generate(PROMPTS, GREEDY)] == expected
    assert spec.stats.num_accepted_tokens > 0
