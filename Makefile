# The two commands of the README: `make demo` and `make test`. Both create/reuse .venv at the repo root.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test lint venv bench clean-venv

venv: $(STAMP)

# Re-install when the dependency list changes; the interpreter is found by scripts/find_python.sh (Python 3.12).
$(STAMP): pyproject.toml
	@if [ ! -x $(PY) ]; then \
	  PYBIN=$$(scripts/find_python.sh) || exit 1; \
	  echo "creating $(VENV) with $$PYBIN"; \
	  "$$PYBIN" -m venv $(VENV); \
	fi
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[dev]"
	@touch $(STAMP)

demo: venv
	OMP_NUM_THREADS=1 $(PY) -m nemo_muon.train.demo

lint: venv
	$(VENV)/bin/ruff check .

test: venv lint
	OMP_NUM_THREADS=1 $(VENV)/bin/pytest tests

bench: venv
	$(PY) bench/ns.py

clean-venv:
	rm -rf $(VENV)
