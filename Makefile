# Two commands are the contract (README): `make demo` and `make test`.
# Both create .venv from pyproject.toml on a fresh machine; nothing else is needed.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export TF_CPP_MIN_LOG_LEVEL ?= 2
export KERAS_BACKEND ?= tensorflow
export PYTHONHASHSEED ?= 0

.PHONY: venv demo test fuzz bench clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m demo

test: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider tests

fuzz: $(STAMP)
	HYPOTHESIS_PROFILE=fuzz $(PY) -m pytest -q -p no:cacheprovider tests -k fuzz

bench: $(STAMP)
	$(PY) -m benchmarks

clean:
	rm -rf $(VENV) build *.egg-info runs
