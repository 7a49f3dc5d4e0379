# kvpilot — the two commands are `make demo` and `make test`.
#
# Test tiers (`make help` prints this block):
#   make check             lint, types and the fast tests (no server processes); under a minute
#   make test-twin         the parallel tier: every test on the twin and fakes, with the coverage floor
#   make test-serial       tests that start several kvpilot and server processes, one at a time
#   make test-real-sglang  the real SGLang server on CPU; the only target that builds its 2.6 GB venv
#   make test-real-vllm    the real vLLM server on CPU (3.4 GB venv), recorded live and compared
#   make test-daemons      the launchers, the bot's image and unit on a real dockerd and systemd (root)
#   make test              the six above, parts of them side by side (what .ci/run calls)
#   make fuzz              the long fuzz run (over 100,000 generated inputs, ~25 min); RELIABILITY.md
#   make gpu-bundle        the real SGLang's packages for a GPU machine, one 40 MiB archive in .gpu/
#   make test-gpu          on an H100/H200 with the bundle: PHASES=smoke,capacity,... (docs/gpu.md)
#   make map               ARCHITECTURE.md's module map and package graph, rewritten from the code
# Working on one tier, run its target; `PYTEST_ARGS=... make test-twin` narrows the parallel tier.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: help test check lint typecheck test-fast test-twin test-serial test-real-sglang venv demo \
	lock bench clean dist real-sglang real-vllm test-real-vllm test-daemons bot-image \
	test-beside-serial test-real-sglang-static test-real-sglang-measured test-real-sglang-servers \
	test-real-vllm-static test-real-vllm-measured fuzz gpu-bundle test-gpu map debs-ready \
	test-serial-beside

help:
	@sed -n '3,15p' Makefile | sed 's/^# \{0,1\}//'

venv: $(STAMP)

# The virtual environment is rebuilt whenever the lock file or the project metadata changes.
# uv (pinned and hashed in the lock, installed by pip) installs every pin of the lock, hashes
# checked, in about 15 s where pip takes about 50 (a fresh clone's `.ci/run`); pip does it
# where uv cannot (KVPILOT_VENV_PIP=1 asks for pip). --compile-bytecode, as pip does: where
# PYTHONDONTWRITEBYTECODE is set (CI machines), every process the tests start would otherwise
# compile what it imports from source (the parallel tier took 40% longer).
UV_PIN := awk '/^uv==/{p=1; print; next} p && /^ /{print; next} {p=0}' requirements.lock
$(STAMP): requirements.lock pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(UV_PIN) > $(VENV)/uv-pin.txt
	if [ "$${KVPILOT_VENV_PIP:-0}" != 1 ] \
	  && $(BIN)/python -m pip install --quiet --require-hashes --no-deps -r $(VENV)/uv-pin.txt \
	  && $(BIN)/uv pip install --quiet --python $(BIN)/python --require-hashes --no-deps \
	    --compile-bytecode -r requirements.lock; then :; else \
	  $(BIN)/python -m pip install --quiet --require-hashes --no-deps -r requirements.lock; fi
	$(BIN)/python -m pip install --quiet --no-deps --no-build-isolation -e .
	touch $(STAMP)

# The real SGLang server on CPU (tests/real_sglang): a separate 2.6 GB environment, installed once.
real-sglang:
	bash tests/real_sglang/setup.sh

# The real vLLM server on CPU (tests/real_vllm): a separate 3.4 GB environment, installed once.
real-vllm:
	bash tests/real_vllm/setup.sh

# Prometheus, dockerd, sshd and debootstrap come from Debian: `.ci/run` installs them in the
# background (tests/debs.sh); the tiers that meet them wait here for that install, if one is under way.
debs-ready:
	@bash tests/debs.sh wait

# make check: lint, types and the fast tests (pure decisions, storage, configuration; no server
# processes), in well under a minute on two cores. make test runs all of it and every tier.
CHECK_TESTS := tests/storage tests/test_architecture.py tests/test_architecture_map.py tests/test_package_graph.py \
	tests/bot/app tests/bot/chat \
	tests/bot/reports/test_config.py tests/bot/slack/test_blocks.py tests/bot/console/test_text.py \
	tests/playbooks/gate tests/playbooks/campaigns tests/playbooks/stats tests/playbooks/engines tests/playbooks/test_http.py tests/playbooks/test_normalised_url.py tests/playbooks/test_clock.py \
	tests/playbooks/diagnose/test_measure.py tests/playbooks/launchers/test_launcher_config.py \
	tests/playbooks/experiments/test_outcome.py tests/playbooks/experiments/test_ownership.py \
	tests/playbooks/experiments/test_failures.py \
	tests/playbooks/experiments/test_restart_slots.py tests/playbooks/experiments/test_engine_slots.py \
	tests/playbooks/experiments/test_lifecycle.py tests/playbooks/experiments/test_steps.py \
	tests/playbooks/experiments/test_rollout.py tests/playbooks/experiments/test_quality_steps.py \
	tests/playbooks/routers/test_drain_decisions.py tests/playbooks/quality \
	tests/sim/test_memory.py tests/sim/test_args.py

check: venv lint typecheck test-fast

test-fast: venv
	$(BIN)/pytest -q -n 2 -p no:cacheprovider $(CHECK_TESTS)

# On two cores the tiers that wait on processes leave a core idle, so `make test` pairs parts that
# do not disturb each other (BENCHMARKS.md, "Test tiers", has the figures): the serial tier beside
# the real daemons and the real engines' static checks (their parsers and memory arithmetic, one
# server start each), then the real-SGLang measurements beside its servers' shapes, then vLLM's
# measurements alone (vLLM pins the cores: the daemons' tier beside it timed out waiting on
# systemd in the container). -O keeps each part's output together.
# make test runs all that make check does: lint and types first, the fast tests in the parallel
# tier (with coverage), not twice.
PAIR := $(MAKE) --no-print-directory -j2 -O
test: lint typecheck test-twin
	$(PAIR) test-serial test-beside-serial SERIAL_SPLIT=1
	$(PAIR) test-real-sglang-measured test-real-sglang-servers
	$(MAKE) --no-print-directory test-real-vllm-measured

# The engines' static checks first: the daemons' tier waits for kvpilot's image, which .ci/run
# builds in the background. The serial tier's Prometheus faults run here, beside the rest of it,
# which is longer than this side without them.
test-beside-serial: venv
	$(MAKE) --no-print-directory -j1 test-real-sglang-static test-real-vllm-static \
		test-serial-beside test-daemons

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: venv
	$(BIN)/mypy

# Tests spend most of their time waiting on the servers they start, so five workers on two
# cores finish in about half the time (the whole tier: 567 s on four, 510 on five, 500 on six,
# whose workers kept the cores 89% busy: BENCHMARKS.md, "Test tiers"); a file's tests stay on
# one worker (shared servers), but for the long files that share nothing, and groups go out in
# the order tests/conftest.py sets. The coverage of bot/, playbooks/ and storage/ is measured
# here, against the floor in pyproject.toml (`fail_under`; the figure is in BENCHMARKS.md).
PYTEST_ARGS ?= -n 5 --dist loadgroup --no-loadscope-reorder --durations=15

test-twin: venv debs-ready
	$(BIN)/pytest -q $(PYTEST_ARGS) -m "not real_sglang and not real_vllm and not serial and not real_daemons and not network" --cov --cov-report=term:skip-covered

# The serial and real-engine tiers compare timing-dependent behaviour (with the twin, with a real
# Prometheus), so they run after the parallel tier, one test at a time, away from it.
# `make test` runs SERIAL_BESIDE in test-beside-serial and the rest of the tier beside it;
# `make test-serial` alone runs the whole tier.
SERIAL_BESIDE := tests/playbooks/sources/prometheus/test_prometheus_faults.py
SERIAL := -m "serial and not real_sglang and not real_vllm and not real_daemons"
test-serial: venv debs-ready
	$(BIN)/pytest -q $(SERIAL) --durations=10 $(if $(SERIAL_SPLIT),--ignore=$(SERIAL_BESIDE))

test-serial-beside: venv debs-ready
	$(BIN)/pytest -q -p no:cacheprovider $(SERIAL) --durations=5 $(SERIAL_BESIDE)

# The launchers against the real daemons: a Docker Engine (the running one, or dockerd started
# on a socket of its own and stopped after) and systemd as PID 1 of a container of it, reached
# over SSH; and the bot's own image and unit from deploy/. One at a time: they share the daemon.
test-daemons: venv debs-ready bot-image
	$(BIN)/pytest -q -m "real_daemons" --durations=10

# kvpilot's image from deploy/docker/Dockerfile on a Debian 12 base made with debootstrap (no
# registry here), saved under .venv/kvpilot-images; built again only when what goes in changes.
bot-image: venv debs-ready
	$(BIN)/python -m tests.real_daemons.bot_image

# The real-SGLang tier in three parts, so that each can run beside work it does not disturb:
# static (SGLang's parser and memory arithmetic judged against kvpilot's), measured (load,
# diagnosis and the gate, where timing matters), and the servers' shapes, twin beside real.
REAL_SGLANG_STATIC := tests/real_sglang/test_judge_sglang.py tests/real_sglang/test_judge_kvpilot.py \
	tests/real_sglang/test_real_arg_parser.py
REAL_SGLANG_MEASURED := tests/playbooks/experiments/test_experiment_real.py \
	tests/playbooks/diagnose/test_diagnose_real.py tests/real_sglang/test_real_reservation.py
test-real-sglang: venv real-sglang
	$(PAIR) test-real-sglang-measured test-real-sglang-servers
	$(MAKE) --no-print-directory test-real-sglang-static

test-real-sglang-static: venv real-sglang
	$(BIN)/pytest -q -p no:cacheprovider -m "real_sglang" --durations=5 $(REAL_SGLANG_STATIC)

test-real-sglang-measured: venv real-sglang
	$(BIN)/pytest -q -p no:cacheprovider -m "real_sglang" --durations=10 $(REAL_SGLANG_MEASURED)

test-real-sglang-servers: venv real-sglang
	$(BIN)/pytest -q -p no:cacheprovider -m "real_sglang" --durations=10 \
		$(addprefix --ignore=,$(REAL_SGLANG_STATIC) $(REAL_SGLANG_MEASURED))

# The real vLLM: the capped server is recorded again here (record_fixtures.py, about a minute and
# a half) and the twin compared with that recording; then the tests that drive vLLM itself. One
# at a time: vLLM pins the cores.
VLLM_LIVE ?= .venv-vllm/live-recording
# Static: vLLM's parser and pool sizing judged against kvpilot's; measured: everything else.
REAL_VLLM_STATIC := tests/real_vllm/test_judge_kvpilot.py tests/real_vllm/test_real_arg_parser.py \
	tests/real_vllm/test_offload_judge.py tests/real_vllm/test_start_judge.py
test-real-vllm: test-real-vllm-static test-real-vllm-measured

test-real-vllm-static: venv real-vllm
	$(BIN)/pytest -q -p no:cacheprovider -m "real_vllm" --durations=5 $(REAL_VLLM_STATIC)

test-real-vllm-measured: venv real-vllm
	rm -rf $(VLLM_LIVE)
	$(BIN)/python -m tests.real_vllm.record_fixtures --only capped --out $(VLLM_LIVE)
	KVPILOT_VLLM_RECORDED=$(VLLM_LIVE) $(BIN)/pytest -q -p no:cacheprovider \
		tests/conformance/test_vllm_twin_vs_recorded.py
	$(BIN)/pytest -q -p no:cacheprovider -m "real_vllm" --durations=10 \
		$(addprefix --ignore=,$(REAL_VLLM_STATIC))

# The real SGLang on a GPU (tests/real_gpu, docs/gpu.md). gpu-bundle runs here (PyPI on the first
# build, then offline): the packages SGLang needs beyond the GPU machine's image, in
# .gpu/kvpilot-gpu-bundle.tar.xz. test-gpu runs on the GPU machine with its own python3 (3.12,
# torch 2.11), the bundle carried in .gpu/: PHASES picks the phases (smoke, capacity,
# experiment-clear, ab), GPU_ARGS adds runner flags, results go to $$OUT (else ./gpu-results).
GPU_PYTHON ?= python3
PHASES ?= smoke
gpu-bundle: venv
	$(BIN)/python -m tests.real_gpu.bundle

test-gpu:
	PYTHONUNBUFFERED=1 $(GPU_PYTHON) -m tests.real_gpu.run --phases $(PHASES) $(GPU_ARGS)

# Bad input in bulk (tests/fuzz): the quick profile runs in the parallel tier of `make test`;
# this is the long one, whose tally (printed at the end) RELIABILITY.md quotes.
fuzz: venv
	KVPILOT_FUZZ=long $(BIN)/pytest -q -s -p no:cacheprovider --durations=10 tests/fuzz

# The package an operator installs: kvpilot's wheel (the bot, its playbooks and storage, and
# the deployment files `kvpilot files` prints), built with the locked setuptools, nothing fetched.
# setuptools' build folders go to a private temporary folder (DIST_EXTRA_CONFIG), not the
# checkout's build/: a build beside other work in the checkout has nothing to share with it.
DIST ?= dist
dist: venv
	@work=$$(mktemp -d) \
	  && printf '[build]\nbuild_base = %s/build\n[egg_info]\negg_base = %s\n' $$work $$work > $$work/build.cfg \
	  && DIST_EXTRA_CONFIG=$$work/build.cfg $(BIN)/python -m pip wheel --quiet --no-deps \
	    --no-build-isolation -w $(DIST) . ; status=$$?; rm -rf $$work; exit $$status
	@ls $(DIST)/kvpilot-*.whl

# The incident end to end on the SGLang twin (or `make demo ENGINE=vllm`, the vLLM twin), in the
# terminal front end (files in demo/).
demo: venv
	$(BIN)/python -m bot.console.demo $(if $(ENGINE),--engine $(ENGINE))

# ARCHITECTURE.md's module map (each product module's docstring, first line) and package graph
# (who imports whom), between their markers; tests/test_architecture_map.py and
# tests/test_package_graph.py, in make check, fail until this is run after a change.
map: venv
	$(BIN)/python -m tests.architecture_map --write
	$(BIN)/python -m tests.package_graph --write

bench: venv
	$(BIN)/python -m bench.twin
	$(BIN)/python -m bench.diagnose

# Regenerate the lock after editing dependencies in pyproject.toml (needs `uv` on PATH).
lock:
	uv pip compile pyproject.toml --extra dev --python-version 3.11 --generate-hashes -o requirements.lock

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
