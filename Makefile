# attnres-ge: the two commands a newcomer runs (see README.md).
#   make demo  - set everything up, then run the main job
#   make test  - set everything up, then run the whole test suite (main suite + torchair interop tier)
#                and the installed-wheel smoke test
PYTHON ?= python3
VENV := .venv
INTEROP_VENV := .venv-interop
# The releases the project is tested on; pyproject.toml declares the ranges (README "Install").
# torch 2.13.0 is a CPU build that pip takes from local disk on our machines, 2.14.1 a CUDA build (about
# 5.5 GB, runs on the CPU) also on local disk. torch_npu comes from PyPI; 2.14.0 requires torch 2.14.0.*,
# which is not on disk, so it goes in with --no-deps over torch 2.14.1.
TORCH := 2.13.0
TORCH_NPU := 2.13.0
TORCH_NEXT := 2.14.1
TORCH_NPU_NEXT := 2.14.0
NEXT_VENV := build/venv-torch-$(TORCH_NEXT)
NEXT_INTEROP_VENV := build/venv-interop-$(TORCH_NPU_NEXT)
WHEELS := build/wheels
# torch_npu's own dependencies besides torch (installed by hand, since torch_npu goes in with --no-deps),
# and what torchair imports without declaring it.
NPU_DEPS := numpy pyyaml "protobuf>=6.31.1,<8" packaging
# The peers of tests/test_general_read_reference.py: the `models` extra of pyproject.toml (repeated here for
# the next venv, which installs the wheel without its extras), pip-resolved on the same command line as a
# pinned torch so that it never changes torch; and fla-core with --no-deps (its Triton is never imported).
MODEL_PEERS := "transformers>=5.25,<6" "einops>=0.8"
FLA_CORE := fla-core==0.6.0
# What a wheel is made of: a change to any of these rebuilds it (ninja recompiles only changed C++).
PACKAGE_SOURCES := pyproject.toml setup.py $(shell find attnres_ge op_proto op_host op_kernel ge_plugin examples \
	-name '*.py' -o -name '*.proto' 2>/dev/null)
NATIVE_SOURCES := $(shell find op_kernel/csrc ge_plugin/csrc -name '*.cpp' -o -name '*.h' 2>/dev/null)
# Builds go through ninja (torch's BuildExtension uses it when `ninja` is on PATH; the venv's own ninja
# is found first), the translation units and the two extensions in parallel, the objects kept per torch
# version under build/torch-<version>-py<XY>/ (setup.py), so a rebuild compiles only what changed. MAX_JOBS=8:
# all translation units at once, so the longest (isa_scalar, sorted late) does not start last.
IN_VENV = PATH="$(CURDIR)/$(1)/bin:$$PATH" MAX_JOBS=$${MAX_JOBS:-8}
PURELIB = $$($(1)/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
# $(call share_venv,NEW,BASE): NEW sees BASE's packages (torch among them) through a .pth file: no second
# copy of torch.
share_venv = $(PYTHON) -m venv $(1) && echo "$(call PURELIB,$(2))" > "$(call PURELIB,$(1))/base-venv.pth"

.PHONY: demo test test-main test-next test-interop test-interop-next test-wheel setup setup-next clean \
	cann-kit cann-host cann-host-drivers

# --no-build-isolation: the native kernels are built against the torch installed just before.
$(VENV)/.installed: pyproject.toml setup.py $(NATIVE_SOURCES)
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip setuptools wheel
	$(VENV)/bin/pip install --quiet torch==$(TORCH) ninja
	$(call IN_VENV,$(VENV)) $(VENV)/bin/pip install --quiet --no-build-isolation -e '.[test,models]' torch==$(TORCH)
	$(VENV)/bin/pip install --quiet --no-deps $(FLA_CORE)
	touch $@

# The main suite a second time on the newer torch, against the wheel built for it (installed, not editable:
# the editable .venv's extensions in the source tree are built for $(TORCH)).
$(NEXT_VENV)/.installed: pyproject.toml
	test -x $(NEXT_VENV)/bin/python || $(PYTHON) -m venv $(NEXT_VENV)
	$(NEXT_VENV)/bin/pip install --quiet --upgrade pip setuptools wheel
	$(NEXT_VENV)/bin/pip install --quiet torch==$(TORCH_NEXT) ninja "protobuf>=6.31.1,<8" \
		"pytest>=8" "hypothesis>=6.100" numpy matplotlib $(MODEL_PEERS)
	$(NEXT_VENV)/bin/pip install --quiet --no-deps $(FLA_CORE)
	touch $@

# One wheel per torch version, built with that torch; reused by every venv of that torch.
builder = $(if $(filter $(TORCH),$(1)),$(VENV),$(NEXT_VENV))
$(WHEELS)/torch-%/.built: $(PACKAGE_SOURCES) $(NATIVE_SOURCES) | $(VENV)/.installed
	rm -rf $(@D)
	$(call IN_VENV,$(call builder,$*)) $(call builder,$*)/bin/pip wheel --quiet --no-build-isolation --no-deps \
		. -w $(@D)
	touch $@

$(NEXT_VENV)/.attnres: $(WHEELS)/torch-$(TORCH_NEXT)/.built
	$(NEXT_VENV)/bin/pip install --quiet --no-deps --no-index --force-reinstall $(WHEELS)/torch-$(TORCH_NEXT)/*.whl
	touch $@

$(WHEELS)/torch-$(TORCH_NEXT)/.built: $(NEXT_VENV)/.installed

setup: $(VENV)/.installed

setup-next: $(NEXT_VENV)/.attnres

demo: setup
	$(VENV)/bin/attnres-ge demo

test-main: setup
	$(VENV)/bin/python -m pytest tests --ignore=tests/interop -q

test-next: setup-next
	$(NEXT_VENV)/bin/python -m pytest tests --ignore=tests/interop -q
	cd /tmp && $(CURDIR)/$(NEXT_VENV)/bin/python - < $(CURDIR)/tests/smoke/installed_wheel.py

# The interop tier's own environments: installing torch_npu makes `import torch` fail unless
# TORCH_DEVICE_BACKEND_AUTOLOAD=0, so it never shares a main one. Each takes torch, this project and the test
# tools from its main venv through a .pth file, and adds torch_npu (from PyPI) and what it needs.
$(INTEROP_VENV)/.installed: $(VENV)/.installed
	rm -rf $(INTEROP_VENV)
	$(call share_venv,$(INTEROP_VENV),$(VENV))
	$(INTEROP_VENV)/bin/pip install --quiet --no-deps torch_npu==$(TORCH_NPU) $(NPU_DEPS)
	touch $@

$(NEXT_INTEROP_VENV)/.installed: $(NEXT_VENV)/.installed
	rm -rf $(NEXT_INTEROP_VENV)
	$(call share_venv,$(NEXT_INTEROP_VENV),$(NEXT_VENV))
	$(NEXT_INTEROP_VENV)/bin/pip install --quiet --no-deps torch_npu==$(TORCH_NPU_NEXT) $(NPU_DEPS)
	touch $@

# Without network (torch_npu cannot be installed) the tier is skipped with a message,
# except in CI, where it must run. $(call interop,VENV,TORCH_NPU VERSION)
define interop
	@if $(MAKE) --no-print-directory $(1)/.installed; then \
		TORCH_DEVICE_BACKEND_AUTOLOAD=0 $(1)/bin/python -m pytest tests/interop \
			--confcutdir=tests/interop -q -p no:logging; \
	elif [ -n "$$CI" ]; then \
		echo "interop tier: could not install torch_npu==$(2); CI must run this tier" >&2; exit 1; \
	else \
		echo "interop tier SKIPPED: could not install torch_npu==$(2) (no network?); it runs in CI"; \
	fi
endef

test-interop: setup
	$(call interop,$(INTEROP_VENV),$(TORCH_NPU))

test-interop-next: setup-next
	$(call interop,$(NEXT_INTEROP_VENV),$(TORCH_NPU_NEXT))

# The wheel, installed non-editable into a fresh venv, imported and run from /tmp and from this folder.
# torch and the other dependencies come from $(VENV) through a .pth file (no second torch install).
WHEEL_VENV := build/venv-wheel
test-wheel: $(WHEELS)/torch-$(TORCH)/.built
	rm -rf $(WHEEL_VENV)
	$(call share_venv,$(WHEEL_VENV),$(VENV))
	$(WHEEL_VENV)/bin/pip install --quiet --no-deps --no-index $(WHEELS)/torch-$(TORCH)/*.whl
	cd /tmp && $(CURDIR)/$(WHEEL_VENV)/bin/python - < $(CURDIR)/tests/smoke/installed_wheel.py
	$(WHEEL_VENV)/bin/python - < tests/smoke/installed_wheel.py
	cd /tmp && $(CURDIR)/$(WHEEL_VENV)/bin/attnres-ge tiling --op backward --shape 64,4,256 > /dev/null

# Each step reports its time (the README's figures come from these lines).
TIMED = @start=$$(date +%s); $(MAKE) --no-print-directory $(1) || exit $$?; \
	echo "make test: $(1) took $$(( $$(date +%s) - start )) s"
test:
	$(call TIMED,test-main)
	$(call TIMED,test-interop)
	$(call TIMED,test-wheel)
	$(call TIMED,test-next)
	$(call TIMED,test-interop-next)

# ---- CANN host registrations (the C++ GE loads on Ascend), built and tested on this CPU against the CANN
# source kit. The kit is read-only input: its build.sh writes only into build/cann-sim (reused between runs).
CANN_SRC ?= ../shared/cann-src
CANN_SIM_DIR := build/cann-sim
CANN_HOST_DIR := build/cann-host
CANN_HOST_LIB := $(CANN_HOST_DIR)/libattnres_ge_cann_host.a
# Our registrations: every *.cpp and *.h in these folders, sorted, so a new op's C++ host files dropped there
# are built with nothing else edited (cann_package/cmake/attnres_inputs.cmake derives the package's the same way).
CANN_HOST_FOLDERS := op_proto/cann op_host/cann
CANN_HOST_SOURCES := $(sort $(wildcard $(addsuffix /*.cpp,$(CANN_HOST_FOLDERS))))
CANN_HOST_OBJS := $(CANN_HOST_SOURCES:%.cpp=$(CANN_HOST_DIR)/obj/%.o)
CANN_HOST_HEADERS := $(sort $(wildcard $(addsuffix /*.h,$(CANN_HOST_FOLDERS))))
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
	rm -rf $(VENV) $(INTEROP_VENV) build *.egg-info op_kernel/*.so ge_plugin/*.so
