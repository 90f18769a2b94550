# Two commands on a fresh machine:  make run   |   make test
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test soak bench microbench lint build clean setup debug

$(STAMP): pyproject.toml setup.py scripts/setup.sh
	bash scripts/setup.sh $(PYTHON) $(VENV)
	touch $(STAMP)

setup: $(STAMP) build

build: $(STAMP)
	$(PY) setup.py -q build_ext --inplace

debug: $(STAMP)
	NSQSHM_DEBUG=1 $(PY) setup.py -q build_ext --inplace --force

run: setup
	$(VENV)/bin/nsqshm start $(ARGS)

# two processes, as the machine has two cores (tests/conftest.py groups what must not overlap)
test: setup
	$(PY) -m pytest -q -n 2 --dist loadgroup $(ARGS)

soak: setup
	$(PY) -m pytest -q -m soak -p no:cacheprovider $(ARGS)

bench: setup
	$(VENV)/bin/nsqshm bench $(ARGS)

microbench: setup
	$(PY) -m pytest -q -m microbench -p no:cacheprovider $(ARGS)

lint: setup
	$(VENV)/bin/ruff check .

clean:
	rm -rf build $(VENV) nsqshm/_core/*.so nsqshm/_core/*.c
