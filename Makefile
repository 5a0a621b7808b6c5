# `make train` and `make test` each create .venv on first use (or when pyproject.toml changes).
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# make test runs the suite in this many pytest-xdist workers (each with one torch thread; tests/conftest.py)
TEST_WORKERS ?= 2

.PHONY: train test lint slow benchmark clean

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

## Train the quick-start experiment (micro DeiT on the embedded relational-shapes data). ARGS="k=v ..."
train: $(STAMP)
	$(PY) train.py experiment=quickstart $(ARGS)

## Lint and run the test suite: unit tests and short integration tests, at most 5 minutes on 2 CPU cores
## (tests marked slow are excluded). A file's tests stay on one worker, so its module fixtures (a trained
## run, generated data) are built once.
test: $(STAMP)
	$(VENV)/bin/ruff check .
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder $(ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check .

## Tests marked slow (real training runs, more train.py processes, torch.compile), in the same workers.
slow: $(STAMP)
	$(PY) -m pytest -q -m slow -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder $(ARGS)

benchmark: $(STAMP)
	$(PY) scripts/benchmark.py $(ARGS)

clean:
	rm -rf runs .data .pytest_cache .ruff_cache
