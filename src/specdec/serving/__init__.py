"""`specdec serve`: an OpenAI-compatible HTTP server over the speculative engine.

    errors.py         OpenAI-style error bodies and the exception handlers (every bad input is a 4xx)
    schemas.py        request models (pydantic) and their translation into SamplingParams
    chat_template.py  messages -> prompt: the tokenizer's chat template, or the plain template for base models
    text_stream.py    incremental text for streaming (holds back what a stop string or a split character may change)
    metrics.py        Prometheus metrics (vLLM's names under the `specdec:` prefix), sliding-window gauges
    scheduler.py      the queue and the one worker thread that runs every generation, step-interleaved
    responses.py      OpenAI response and chunk bodies, with each request's speculative figures
    app.py            the FastAPI app and its routes
    server.py         the `specdec serve` command
"""
