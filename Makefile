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

.PHONY: demo test test-main test-interop test-wheel setup clean cann-kit cann-host cann-host-drivers

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

# ---- CANN host registrations (the C++ GE loads on Ascend), built and tested on this CPU against the CANN
# source kit. The kit is read-only input: its build.sh writes only into build/cann-sim (reused between runs).
CANN_SRC ?= ../shared/cann-src
CANN_SIM_DIR := build/cann-sim
CANN_HOST_DIR := build/cann-host
CANN_HOST_LIB := $(CANN_HOST_DIR)/libattnres_ge_cann_host.a
CANN_HOST_SOURCES := $(shell grep -v -e '^\#' -e '^[[:space:]]*$$' op_host/cann_sources.txt)
CANN_HOST_OBJS := $(CANN_HOST_SOURCES:%.cpp=$(CANN_HOST_DIR)/obj/%.o)
CANN_HOST_HEADERS := $(wildcard op_host/*.h op_proto/*.h)
CANN_JOBS ?= $(shell nproc 2>/dev/null || echo 2)
CANN_CXX ?= g++
# Recursively expanded: read only when a cann-* target runs, so other targets work without the kit.
CANN_CXXFLAGS = -std=c++17 -O1 -g0 -w -DOS_TYPE=0 $(shell sed 's|^|-I$(abspath $(CANN_SRC))/|' $(CANN_SRC)/include_dirs.txt)
CANN_SIM_LIBS = -Wl,--whole-archive $(CANN_SIM_DIR)/lib/libcann_sim_stubs.a -Wl,--no-whole-archive \
	$(CANN_SIM_DIR)/lib/libcann_host_sim.a -rdynamic -Wl,-u,GetRegisteredOpNum -Wl,-u,GetOpImplFunctionsV2 \
	-Wl,-u,GetOpImplFunctions -Wl,-u,GetRegisteredOpCtNum -Wl,-u,GetOpCtImplFunctions -ldl -lpthread

cann-kit:
	@test -f $(CANN_SRC)/build.sh || { echo "cann-host: no CANN source kit at CANN_SRC=$(CANN_SRC)" >&2; exit 1; }
	$(CANN_SRC)/build.sh $(CANN_SIM_DIR) --no-harness -j $(CANN_JOBS)

$(CANN_HOST_DIR)/obj/%.o: %.cpp $(CANN_HOST_HEADERS) | cann-kit
	@mkdir -p $(@D)
	$(CANN_CXX) $(CANN_CXXFLAGS) -c $< -o $@

# Only our registrations: consumers link it with --whole-archive, as the kit's README links upstream's archive.
$(CANN_HOST_LIB): $(CANN_HOST_OBJS)
	rm -f $@
	ar rcs $@ $^

cann-host: cann-kit $(CANN_HOST_LIB)

# CANN's host code of the two-phase ops (BlockAttnResPrepare / BlockAttnResUpdate), staged in the kit under
# upstream/two-phase (not built by the kit's build.sh): the oracle tests/cann compares ours with.
TWO_PHASE_SRC = $(abspath $(CANN_SRC))/upstream/two-phase
TWO_PHASE_DIR := $(CANN_HOST_DIR)/upstream-two-phase
TWO_PHASE_LIB := $(TWO_PHASE_DIR)/libupstream_two_phase_host.a
TWO_PHASE_SOURCES = $(wildcard $(TWO_PHASE_SRC)/attention/*/op_host/*.cpp $(TWO_PHASE_SRC)/attention/*/op_host/*/*.cpp \
	$(TWO_PHASE_SRC)/attention/*/op_host/*/*/*.cpp)
TWO_PHASE_OBJS = $(patsubst $(TWO_PHASE_SRC)/%.cpp,$(TWO_PHASE_DIR)/obj/%.o,$(TWO_PHASE_SOURCES))
TWO_PHASE_LOG_OBJ := $(TWO_PHASE_DIR)/obj/opbase_log.o
TWO_PHASE_CXXFLAGS = $(CANN_CXXFLAGS) -I$(abspath $(CANN_SRC))/upstream/ops-transformer/common/include \
	-I$(abspath $(CANN_SRC))/upstream/opbase/include -I$(TWO_PHASE_SRC)/opbase/include/op_common/op_host \
	-I$(TWO_PHASE_SRC)

$(TWO_PHASE_DIR)/obj/%.o: $(TWO_PHASE_SRC)/%.cpp | cann-kit
	@mkdir -p $(@D)
	$(CANN_CXX) $(TWO_PHASE_CXXFLAGS) -c $< -o $@

$(TWO_PHASE_LOG_OBJ): $(TWO_PHASE_SRC)/opbase/src/op_common/log/log.cpp | cann-kit
	@mkdir -p $(@D)
	$(CANN_CXX) $(TWO_PHASE_CXXFLAGS) -c $< -o $@

$(TWO_PHASE_LIB): $(TWO_PHASE_OBJS)
	@test -n "$(TWO_PHASE_OBJS)" || { echo "no upstream/two-phase sources in CANN_SRC=$(CANN_SRC)" >&2; exit 1; }
	rm -f $@
	ar rcs $@ $^

# tests/cann: the same driver linked with our registrations and with upstream's; the SoC file is copied where
# fe::PlatformInfoManager looks for it (<exe dir>/../data/platform_config).
CANN_DRIVER_OBJS := $(CANN_HOST_DIR)/obj/tests/cann/cann_driver.o $(CANN_HOST_DIR)/obj/tests/cann/opdef_json.o

$(CANN_HOST_DIR)/obj/tests/cann/opdef_json.o: tests/cann/opdef_json.cpp | cann-kit
	@mkdir -p $(@D)
	$(CANN_CXX) $(CANN_CXXFLAGS) -fno-access-control -c $< -o $@

cann-host-drivers: cann-host $(CANN_DRIVER_OBJS) $(TWO_PHASE_LIB) $(TWO_PHASE_LOG_OBJ)
	@mkdir -p $(CANN_HOST_DIR)/bin $(CANN_HOST_DIR)/data/platform_config
	cp -f $(CANN_SIM_DIR)/data/platform_config/Ascend910B2.ini $(CANN_HOST_DIR)/data/platform_config/
	cp -f $(TWO_PHASE_SRC)/runtime/src/platform/platform_config/cann-dev/Ascend950PR_9579.ini \
		$(CANN_HOST_DIR)/data/platform_config/
	$(CANN_CXX) -o $(CANN_HOST_DIR)/bin/driver_ours $(CANN_DRIVER_OBJS) \
		-Wl,--whole-archive $(CANN_HOST_LIB) -Wl,--no-whole-archive $(CANN_SIM_LIBS)
	$(CANN_CXX) -o $(CANN_HOST_DIR)/bin/driver_upstream $(CANN_DRIVER_OBJS) \
		-Wl,--whole-archive $(CANN_SIM_DIR)/lib/libupstream_attnres_host.a $(TWO_PHASE_LIB) -Wl,--no-whole-archive \
		$(TWO_PHASE_LOG_OBJ) $(CANN_SIM_LIBS)

clean:
	rm -rf $(VENV) $(INTEROP_VENV) build *.egg-info
