# Two commands are the contract (README): `make demo` and `make test`.
# Both create .venv from pyproject.toml + constraints.txt on a fresh machine; nothing else is needed.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export TF_CPP_MIN_LOG_LEVEL ?= 2
export KERAS_BACKEND ?= tensorflow
export PYTHONHASHSEED ?= 0

.PHONY: venv demo test test-fast lint fuzz bench clean

venv: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# Venvs made before the switch to `tensorflow` hold tensorflow-cpu: its files
	# and the `tensorflow` wheel's are the same paths, so it goes first.
	$(PY) -m pip uninstall --quiet --yes tensorflow-cpu 2>/dev/null || true
	# Ranges in pyproject.toml, the tested versions in constraints.txt.
	$(PY) -m pip install --quiet -c constraints.txt -e '.[dev]'
	touch $(STAMP)

# The main demo (offline, embedded data): train the four tagger archs and
# compare them, export the attention tagger for TF Serving and LiteRT, then tag
# ambiguous sentences with the exported TFLite model. runs/demo is the demo's
# own scratch directory and is replaced on every run.
DEMO := runs/demo
demo: $(STAMP)
	rm -rf $(DEMO)
	$(PY) -m train tagger --compare --out $(DEMO)
	$(PY) -m export savedmodel $(DEMO)/attention --out $(DEMO)/serving/tagger
	$(PY) -m export tflite $(DEMO)/attention --out $(DEMO)/tagger.tflite
	$(PY) -m zoo.tag $(DEMO)/tagger.tflite "I saw a saw" "they can can the fish" \
		"she will book a book about the watch" "we watch the old man run the race"

# Files stay whole on one worker (--dist loadfile) so module fixtures (a trained
# run, an export) are built once. The 40 slowest tests are listed at the end: where
# the suite's time goes (LONGEST_FIRST in tests/conftest.py orders files by it).
test: lint
	$(PY) -m pytest -q -p no:cacheprovider -n 2 --dist loadfile --durations=40 tests

# Everything not marked slow (no training, export or process start-up): the
# everyday loop.
test-fast: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider -n 2 --dist loadfile -m "not slow" tests

LINTED := layers zoo train export tests benchmarks
lint: $(STAMP)
	$(PY) -m ruff check $(LINTED)
	$(PY) -m ruff format --check $(LINTED)

fuzz: $(STAMP)
	HYPOTHESIS_PROFILE=fuzz $(PY) -m pytest -q -p no:cacheprovider tests -k fuzz

bench: $(STAMP)
	$(PY) -m benchmarks

clean:
	rm -rf $(VENV) build *.egg-info runs
