# Quick start: `make run` (chat app on http://localhost:8501) and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
CORE := $(VENV)/.core-installed
DEV := $(VENV)/.dev-installed
LLM := $(VENV)/.llm-installed
LLAMA_CMAKE_ARGS ?= -DLLAVA_BUILD=OFF -DGGML_NATIVE=OFF
PORT ?= 8501

.PHONY: run test test-deps test-fast setup setup-llm build vectors chromium slurm bench clean

$(CORE): requirements.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -r requirements.txt
	$(BIN)/python -m pip install -q --no-deps -e .
	touch $@

$(DEV): $(CORE) requirements-dev.txt
	$(BIN)/python -m pip install -q -r requirements-dev.txt
	touch $@

$(LLM): $(CORE) requirements-llm.txt
	@echo "building llama-cpp-python from source (several minutes on a small machine) ..."
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(BIN)/python -m pip install -q -r requirements-llm.txt
	touch $@

setup: $(CORE)

setup-llm: $(LLM)

chromium:
	@command -v chromium >/dev/null 2>&1 || { apt-get update -q && apt-get install -y -q chromium; }

# A real Slurm for the remediation tests (tests/slurm_cluster.py starts a single-host cluster).
slurm:
	@command -v slurmctld >/dev/null 2>&1 || { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q slurm-wlm munge; }

# After the bundled reports change: their shipped vectors for both bundled models, so a build need
# not embed them (about 15 minutes on two cores; then `pmkb calibrate --out` for each model).
vectors: $(CORE)
	$(BIN)/python -m kb.engine.shipped_vectors

build: $(CORE)
	$(BIN)/pmkb build

run: build
	$(BIN)/python -m ui.serve --server.port $(PORT) --server.headless true \
		--browser.gatherUsageStats false

# What `make test` needs: the apt packages install while pip installs and compiles (they share
# no lock), then the two apt targets run one after the other (they share dpkg's).
test-deps:
	@$(MAKE) --no-print-directory chromium slurm & apt=$$!; \
	$(MAKE) --no-print-directory $(DEV) $(LLM); pip=$$?; \
	wait $$apt; apt=$$?; \
	test $$pip -eq 0 || { echo "make test-deps: the pip installs failed (see above)"; exit 1; }; \
	test $$apt -eq 0 || { echo "make test-deps: apt could not install chromium or slurm (run as root)"; exit 1; }

test: test-deps
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q

test-fast: $(DEV)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q -m "not slow and not browser and not llm"

bench: $(CORE)
	$(BIN)/python bench/ingest_search.py

clean:
	rm -rf $(VENV) .pytest_cache
