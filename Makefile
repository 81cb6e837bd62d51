# attnres-ge: the two commands a newcomer runs (see README.md).
#   make demo  - set everything up, then run the main job
#   make test  - set everything up, then run the whole test suite
PYTHON ?= python3
VENV := .venv
# torch is pinned: pip takes this CPU build from local disk on our machines; an unpinned
# resolver may download a multi-GB CUDA build.
TORCH := torch==2.13.0

.PHONY: demo test test-main setup clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip setuptools wheel
	$(VENV)/bin/pip install --quiet $(TORCH)
	$(VENV)/bin/pip install --quiet --no-build-isolation -e '.[test]'
	touch $@

setup: $(VENV)/.installed

demo: setup
	$(VENV)/bin/attnres-ge demo

test-main: setup
	$(VENV)/bin/python -m pytest tests --ignore=tests/interop -q

test: test-main

clean:
	rm -rf $(VENV) build *.egg-info
