VENV ?= .venv
PY := $(VENV)/bin/python
export DAGSTER_HOME ?= $(CURDIR)/dagster_home

.PHONY: install demo test dev validate clean

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $@

install: $(VENV)/.installed

demo: install  ## the example dataset through the asset graph on the embedded simulated model
	VENV=$(VENV) scripts/demo.sh

test: install
	$(VENV)/bin/pytest

validate: install
	$(VENV)/bin/dagster definitions validate -w workspace.yaml

dev: install  ## the Dagster UI on http://127.0.0.1:3000
	$(VENV)/bin/dagster dev -w workspace.yaml -h 127.0.0.1 -p 3000

clean:
	rm -rf data dagster_home/storage dagster_home/history dagster_home/schedules dagster_home/logs
