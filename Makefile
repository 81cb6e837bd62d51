# attnres-ge: the two commands a newcomer runs (see README.md).
#   make demo  - set everything up, then run the main job
#   make test  - set everything up, then run the whole test suite (main suite + torchair interop tier)
#                and the installed-wheel smoke test
PYTHON ?= python3
VENV := .venv
INTEROP_VENV := .venv-interop
# torch is pinned: pip takes this CPU build from local disk on our machines; an unpinned
# resolver may download a multi-GB CUDA build. torch_npu 2.13.0 pins the same torch.
TORCH := torch==2.13.0
TORCH_NPU := torch_npu==2.13.0

.PHONY: demo test test-main test-interop test-wheel setup clean

# --no-build-isolation: the native kernels are built against the torch installed just before.
$(VENV)/.installed: pyproject.toml setup.py
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip setuptools wheel
	$(VENV)/bin/pip install --quiet $(TORCH)
	$(VENV)/bin/pip install --quiet --no-build-isolation -e '.[test]'
	touch $@

# The interop tier's own environment: installing torch_npu makes `import torch` fail unless
# TORCH_DEVICE_BACKEND_AUTOLOAD=0, so it never shares the main one. torch_npu comes from PyPI.
$(INTEROP_VENV)/.installed: pyproject.toml setup.py
	$(PYTHON) -m venv $(INTEROP_VENV)
	$(INTEROP_VENV)/bin/pip install --quiet --upgrade pip setuptools wheel
	$(INTEROP_VENV)/bin/pip install --quiet $(TORCH) $(TORCH_NPU) "protobuf>=6.31.1,<8" packaging pytest
	$(INTEROP_VENV)/bin/pip install --quiet --no-build-isolation --no-deps -e .
	touch $@

setup: $(VENV)/.installed

demo: setup
	$(VENV)/bin/attnres-ge demo

test-main: setup
	$(VENV)/bin/python -m pytest tests --ignore=tests/interop -q

# Without network (torch_npu cannot be installed) the tier is skipped with a message,
# except in CI, where it must run.
test-interop:
	@if $(MAKE) --no-print-directory $(INTEROP_VENV)/.installed; then \
		TORCH_DEVICE_BACKEND_AUTOLOAD=0 $(INTEROP_VENV)/bin/python -m pytest tests/interop \
			--confcutdir=tests/interop -q -p no:logging; \
	elif [ -n "$$CI" ]; then \
		echo "interop tier: could not install $(TORCH_NPU); CI must run this tier" >&2; exit 1; \
	else \
		echo "interop tier SKIPPED: could not install $(TORCH_NPU) (no network?); it runs in CI"; \
	fi

# The wheel, installed non-editable into a fresh venv, imported and run from /tmp and from this folder.
# torch and the other dependencies come from $(VENV) through a .pth file (no second torch install).
WHEEL_DIR := build/wheel
WHEEL_VENV := build/venv-wheel
test-wheel: setup
	rm -rf $(WHEEL_DIR) $(WHEEL_VENV)
	$(VENV)/bin/pip wheel --quiet --no-build-isolation --no-deps . -w $(WHEEL_DIR)
	$(PYTHON) -m venv $(WHEEL_VENV)
	$(VENV)/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])" \
		> "$$($(WHEEL_VENV)/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")/main-venv.pth"
	$(WHEEL_VENV)/bin/pip install --quiet --no-deps --no-index $(WHEEL_DIR)/*.whl
	cd /tmp && $(CURDIR)/$(WHEEL_VENV)/bin/python - < $(CURDIR)/tests/smoke/installed_wheel.py
	$(WHEEL_VENV)/bin/python - < tests/smoke/installed_wheel.py
	cd /tmp && $(CURDIR)/$(WHEEL_VENV)/bin/attnres-ge tiling --op backward --shape 64,4,256 > /dev/null

test: test-main test-interop test-wheel

clean:
	rm -rf $(VENV) $(INTEROP_VENV) build *.egg-info
