# The two commands of the README: `make demo` and `make test`. Both create/reuse .venv at the repo root.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# The exact versions .venv gets (pyproject.toml declares ranges; this constraints file picks one in each).
LOCK := requirements/cpu-dev.txt
# What the tests and the demo import: the torch and Megatron-Core backends, NeMo-Run, the test tools.
EXTRAS := train,megatron,nemo-run,dev
# The container-stack test environment: NGC nemo:26.02's Python stack (docs/container_stack.md).
STACK_VENV := .venv-ngc
STACK_LOCK := requirements/container-stack-26.02.txt
STACK_STAMP := $(STACK_VENV)/.installed
# The newest-stack test environment: NGC nemo:26.08's Python stack (Bridge 0.6, Megatron-Core 0.19, no NeMo toolkit).
NEWEST_VENV := .venv-ngc-26.08
NEWEST_STAMP := $(NEWEST_VENV)/.installed
NEWEST_TESTS := tests/newest_stack
# NGC 26.04's and 26.06's stacks (Bridge 0.4 / 0.5, Megatron-Core 0.17 / 0.18): the optimizer through provide(), every
# megatron recipe against the release's perf run, and Megatron-Core's training and checkpoint resume (the layer-wise
# path: Muon and SOAP trained, Muon resumed, also at another DP size; every optimizer's runs in .venv and .venv-ngc;
# of the cost layout's tests, the planning-only ones run in .venv: the same planning code on 0.18; CI time) (the rest of
# tests/megatron_cpu states 0.16's or 0.18+'s ownership and manifest behaviour, and runs in .venv and .venv-ngc; of
# test_cost_layout.py the two split tests of chunked stages and expert parallelism run in .venv only: the same planning
# code on 0.18 and 0.19). Of test_preflight.py the releases run the reduce-scatter path through Bridge's setup at EP=2
# on 4 ranks (its 2-rank path runs on .venv-ngc and .venv); .venv runs the whole file and .venv-ngc all but Qwen3,
# and .venv's Megatron-Core 0.19.2 is 26.08's (CI time).
MID_RELEASES := 26.04 26.06
MID_STAMPS := $(foreach r,$(MID_RELEASES),.venv-ngc-$(r)/.installed)
MID_TESTS := $(addprefix $(NEWEST_TESTS)/,test_environment.py test_bridge_provider.py test_bridge_recipes_04_05.py \
	test_install_beside_container.py test_bridge_layout.py) $(addprefix tests/megatron_cpu/test_megatron_training.py::,\
	$(addprefix test_tiny_model_trains_through_megatron,[muon-tiny_kimi_k2] [soap-tiny_qwen3_moe]) \
	test_megatron_checkpoint_resume_continues_the_loss_curve[tiny_kimi_k2-muon] \
	test_layer_wise_checkpoint_resumes_at_another_data_parallel_size[2-1-muon]) \
	$(addprefix tests/megatron_cpu/test_cost_layout.py::,\
	test_an_older_megatron_core_is_refused_naming_what_it_lacks \
	test_cost_layout_sends_two_thirds_of_the_legacy_bytes_with_the_same_masters[2-200] \
	test_split_ownership_on_the_cost_layout_resumes_from_a_checkpoint_bit_for_bit \
	test_a_split_target_on_a_layout_not_planned_with_it_is_refused_naming_the_field) \
	tests/megatron_cpu/test_owner_collectives.py \
	tests/megatron_cpu/test_optimizer_state_checkpoint.py tests/megatron_cpu/test_megatron_parity.py \
	tests/megatron_cpu/test_pinned_hook_points.py $(NEWEST_TESTS)/test_bridge_checkpoint.py \
	tests/megatron_cpu/test_preflight.py::test_the_recipes_path_passes_every_check_and_writes_its_report[reduce_scatter-pp2-ep2-4ranks]
# What the mid releases leave out of the files they run (CI time): the owner collectives at 4 ranks and with pipeline
# stages (0.17 is the 0.16 generation: test-stack runs them there) and 0.18's 4-rank cost-layout runs (.venv runs
# them on 0.19, the same core_018_plus code).
OWNER_COLLECTIVES := tests/megatron_cpu/test_owner_collectives.py::
MID_DESELECT := $(addprefix --deselect $(OWNER_COLLECTIVES),\
	test_gradients_reduced_to_owners_send_two_thirds_of_the_all_reduce_bytes_with_the_same_masters[dp4] \
	test_with_pipeline_parallelism_the_stages_reduce_to_their_owners_bit_for_bit_as_the_legacy_path \
	test_with_two_virtual_pipeline_chunks_per_rank_every_chunk_reduces_to_its_owners_bit_for_bit)
# What test-stack leaves out of tests/megatron_cpu on 0.16 (CI time): preflight's Qwen3 path, the same preflight code
# on every stack, run in .venv.
STACK_DESELECT := --deselect tests/megatron_cpu/test_preflight.py::test_the_recipes_path_passes_every_check_and_writes_its_report[qwen3-2ranks]
# Bridge 0.6's own model and optimizer setup under preflight (ours is built by it on 26.02-26.08: test-stack runs
# tests/megatron_cpu on 26.02's, the mid releases MID_TESTS' preflight paths; .venv has no Bridge).
NEWEST_PREFLIGHT := tests/megatron_cpu/test_preflight.py::test_the_recipes_path_passes_every_check_and_writes_its_report[reduce_scatter-pp2-ep2-4ranks]
# The harness's shims on Megatron-Core 0.17 (26.04): which of them 0.17 needs, hit where documented (0.16's run in
# test-stack, 0.19's in test-main; 0.18 is the 0.19 generation).
SHIMS_0_17 := tests/megatron_cpu/test_shims.py
# Tests that need the container stack live here and run only in it; tests/megatron_cpu runs in both environments.
STACK_TESTS := tests/container_stack
# Tests of the newest stack (Bridge >= 0.4's extension point) live here and run only there.
# Both environments are installed by uv (bootstrapped into .venv with pip) from one cache in the repo, hard-linked:
# what the two locks pin alike, above all the CUDA build of torch 2.10 and its nvidia-* libraries (about 7 GB), lies on
# disk once, and no wheel is kept beside what it installed. CI machines have little free disk (docs/testing.md).
# Bytecode is compiled at install, as pip does: where PYTHONDONTWRITEBYTECODE is set (CI), every process (each test
# rank) would otherwise compile torch's and Megatron's sources again at import.
UV_VERSION := 0.13.9
UV := $(VENV)/bin/uv
export UV_CACHE_DIR := $(CURDIR)/.cache/uv
export UV_LINK_MODE := hardlink
export UV_COMPILE_BYTECODE := 1

.PHONY: demo test test-avx2 test-main test-stack test-newest test-unit system-deps lint venv stack-venv newest-venv bench clean-venv

venv: $(STAMP)

# Re-install when the dependency list or the lock changes; the interpreter is found by scripts/find_python.sh (Python
# 3.12). The venv keeps its own pip (tests run `pip install --dry-run`); uv installs the lock.
$(STAMP): pyproject.toml $(LOCK)
	@if [ ! -x $(PY) ]; then \
	  PYBIN=$$(scripts/find_python.sh) || exit 1; \
	  echo "creating $(VENV) with $$PYBIN"; \
	  "$$PYBIN" -m venv $(VENV); \
	fi
	$(PY) -m pip install --quiet --no-cache-dir uv==$(UV_VERSION)
	$(UV) pip install --quiet --python $(PY) -c $(LOCK) -e ".[$(EXTRAS)]"
	@touch $(STAMP)

stack-venv: $(STACK_STAMP)

# Needs .venv's uv (and reuses its cache): see UV above.
$(STACK_STAMP): $(STACK_LOCK) pyproject.toml scripts/container_stack_env.sh $(STAMP)
	scripts/container_stack_env.sh $(STACK_VENV) $(STACK_LOCK) $(UV)
	@touch $(STACK_STAMP)

newest-venv: $(NEWEST_STAMP) $(MID_STAMPS)

# One environment per NGC release stack after 26.02 (.venv-ngc-<release>), each from requirements/container-stack-<release>.txt.
.venv-ngc-%/.installed: requirements/container-stack-%.txt pyproject.toml scripts/container_stack_env.sh $(STAMP)
	scripts/container_stack_env.sh .venv-ngc-$* requirements/container-stack-$*.txt $(UV)
	@touch $@

demo: venv
	OMP_NUM_THREADS=1 $(PY) -m nemo_muon.train.demo

lint: venv
	$(VENV)/bin/ruff check .

# Every tier prints its slowest tests (what CI time is spent on).
DURATIONS := --durations=15
# Every tier runs (docs/testing.md): markers select, nothing is deselected here.
test: system-deps test-main test-stack test-newest

# The system tools the system tests use (Slurm, podman, ...): installed here, never inside a test. Quick when
# present; installs with apt-get only as root; otherwise (or when apt-get fails) it names what is missing and goes
# on: the tests that need a missing tool skip (Slurm) or fail (podman) with that reason, as they would without it.
system-deps:
	@scripts/system_deps.sh || echo "system-deps: not all installed (see above); continuing"

test-main: venv lint system-deps
	OMP_NUM_THREADS=1 $(VENV)/bin/pytest $(DURATIONS) tests --ignore=$(STACK_TESTS) --ignore=$(NEWEST_TESTS)

# The developers' quick tier: .venv's tests without the system and slow ones (installs nothing system-wide).
test-unit: venv
	OMP_NUM_THREADS=1 $(VENV)/bin/pytest tests --ignore=$(STACK_TESTS) --ignore=$(NEWEST_TESTS) -m "not system and not slow"

test-stack: stack-venv
	OMP_NUM_THREADS=1 $(STACK_VENV)/bin/python -m pytest $(DURATIONS) $(STACK_TESTS) tests/megatron_cpu $(STACK_DESELECT)

test-newest: newest-venv
	OMP_NUM_THREADS=1 $(NEWEST_VENV)/bin/python -m pytest $(DURATIONS) $(NEWEST_TESTS) $(NEWEST_PREFLIGHT) \
	  --ignore=$(NEWEST_TESTS)/test_bridge_recipes_04_05.py
	for r in $(MID_RELEASES); do OMP_NUM_THREADS=1 .venv-ngc-$$r/bin/python -m pytest $(DURATIONS) $(MID_TESTS) \
	  $(MID_DESELECT) || exit 1; done
	OMP_NUM_THREADS=1 .venv-ngc-26.04/bin/python -m pytest $(DURATIONS) $(SHIMS_0_17)

# The whole suite as an AVX2-only x86-64 CPU (AMD EPYC) computes: ATen, oneDNN and MKL kernels limited to AVX2
# (docs/testing.md, "Other CPUs"). Not part of `make test`: it runs the same tests a second time.
test-avx2:
	ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 $(MAKE) test

bench: venv
	$(PY) bench/ns.py

clean-venv:
	rm -rf $(VENV) $(STACK_VENV) $(NEWEST_VENV) $(foreach r,$(MID_RELEASES),.venv-ngc-$(r)) $(UV_CACHE_DIR)
