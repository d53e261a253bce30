"""Issue 24, item 1: a long prompt neither stalls the streams that are decoding nor needs memory in
proportion to its square. Step costs are simulated with a fake clock (cost = a + b x rows), so the test is
exact and fast; the real figures come from scripts/serve_long_prompt.sh."""

from __future__ import annotations

import pytest

import specdec.scheduling.scheduler as scheduler_module
from specdec.api import LLM
from specdec.sampling_params import SamplingParams
from specdec.scheduling.prefill_pacing import REFRESH_EVERY, PrefillPacing

DECODE_SECONDS = 0.05
ROW_SECONDS = 0.004


def test_pacing_rows_follow_the_measured_costs():
    pacing = PrefillPacing(0.5)
    assert pacing.rows() == 0  # nothing measured: a decode-only step first
    pacing.observe(DECODE_SECONDS, 0)
    assert pacing.rows() > 0
    for _ in range(30):
        rows = pacing.rows()
        pacing.observe(DECODE_SECONDS + ROW_SECONDS * rows, rows)
    assert pacing.rows() in (0, int(0.5 * DECODE_SECONDS / ROW_SECONDS))  # 6 rows add 0.024 s <= 0.025 s
    with pytest.raises(ValueError, match="share"):
        PrefillPacing(0)


@pytest.mark.parametrize("pacing", [0.5, None])
def test_a_long_prompt_is_paced_beside_a_decoding_stream(zoo, monkeypatch, pacing):
    clock = [0.0]
    steps = []  # (prefill rows, decoding sequences, step seconds, request ids with output)
    real_run_step = scheduler_module.run_step

    def timed_run_step(work):
        rows = sum(w.chunk for w in work)
        decoding = sum(1 for w in work if not w.seq.prefilling)
        seconds = (DECODE_SECONDS if decoding else 0.0) + ROW_SECONDS * rows
        clock[0] += seconds
        out = real_run_step(work)
        caps = [w.chunk * w.seq.capacity for w in work if w.chunk]
        steps.append((rows, decoding, seconds, set(out), caps))
        return out

    monkeypatch.setattr(scheduler_module, "run_step", timed_run_step)
    monkeypatch.setattr(scheduler_module.time, "perf_counter", lambda: clock[0])
    llm = LLM(zoo.path("llama"), device="cpu", max_model_len=2048)
    llm.scheduler_config = scheduler_module.SchedulerConfig(prefill_pacing=pacing, max_attention_elements=1 << 18)
    batch = llm.new_scheduler()
    short = batch.add([1, 5, 6], SamplingParams(max_tokens=400, temperature=0, ignore_eos=True))
    batch.step()  # the short prompt is read and its stream starts
    long = batch.add([1] + [7] * 1500, SamplingParams(max_tokens=2, temperature=0, ignore_eos=True))
    while not any(long in s[3] for s in steps):
        batch.step()
    beside = [s for s in steps[1:] if s[1]]  # steps where the short stream decoded beside the long prompt
    assert beside and all(short in s[3] for s in beside)  # its tokens kept coming, one per step
    assert all(c <= 1 << 18 for s in steps for c in s[4])  # every chunk's scores within max_attention_elements
    worst = max(s[2] for s in beside[2:])
    if pacing is None:
        assert worst > 2 * DECODE_SECONDS  # unpaced: 512-row chunks make the stream wait 40x longer
    else:
        assert worst <= (1 + pacing) * DECODE_SECONDS + 1e-9
        measuring = [s for s in beside if s[0] == 0]
        assert len(measuring) <= 2 + len(beside) // REFRESH_EVERY  # decode-only steps stay rare


def test_a_short_prompt_does_not_wait_for_a_long_prefill(zoo):
    """Before: prompts were read oldest first, so a request arriving while a long prompt was being read got no
    rows until that prompt was done (a stream restarting beside a 30k-token prompt waited 9 minutes)."""
    llm = LLM(zoo.path("llama"), device="cpu", max_model_len=2048)
    llm.scheduler_config = scheduler_module.SchedulerConfig(max_num_batched_tokens=64)
    batch = llm.new_scheduler()
    long = batch.add([1] + [7] * 1500, SamplingParams(max_tokens=2, temperature=0, ignore_eos=True))
    batch.step()
    short = batch.add([1, 5, 6], SamplingParams(max_tokens=2, temperature=0, ignore_eos=True))
    out = batch.step()
    assert short in out and long not in out  # the short prompt was read in full, the long one goes on
