# Two set-up commands for a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip install --quiet --disable-pip-version-check

.PHONY: demo test install install-dev bench clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	# torch first and pinned: 2.13.0 is a local CPU wheel here; anything else downloads gigabytes
	$(PIP) torch==2.13.0
	$(PIP) -e .
	touch $@

$(VENV)/.installed-dev: $(VENV)/.installed
	$(PIP) -e '.[dev]'
	touch $@

install: $(VENV)/.installed
install-dev: $(VENV)/.installed-dev

demo: install
	$(VENV)/bin/specdec demo

test: install-dev
	$(PY) -m pytest tests -q -n auto --maxprocesses=4 --dist loadfile

bench: install
	$(VENV)/bin/specdec bench --prompts ../shared/data/eval/mt_bench/question.jsonl \
		--speculative-config '{"method": "ngram", "num_speculative_tokens": 5}' --output out/bench-mt_bench.json

clean:
	rm -rf $(VENV) build dist src/*.egg-info
