# The two set-up commands of the README. Both create or reuse .venv and install what they need.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)

CHROMIUM := $(VENV)/.chromium

.PHONY: demo test lint mutate clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# torch first, exactly pinned, so nothing else drags in a CUDA build.
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e ".[dev]"
	# The bfcl family needs bfcl-eval's data, API classes and checker, not its ~90 model-handler
	# dependencies (which would also downgrade numpy): see the `bfcl` extra in pyproject.toml.
	$(BIN)/pip install --quiet --no-deps "bfcl-eval>=2026.3.23" "mpmath>=1.3"
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

demo: $(STAMP)
	rm -rf runs/quickstart
	$(BIN)/sentinel loop --config configs/quickstart.yaml --run-dir runs/quickstart
	$(BIN)/sentinel status --run-dir runs/quickstart

# tests/test_report.py opens a real run's report in headless Chromium. Installed here, once, where
# apt-get and root allow (never from inside the suite); elsewhere, or if the install fails, that
# test skips and says why.
$(CHROMIUM): $(STAMP)
	-if ! command -v chromium >/dev/null && ! command -v chromium-browser >/dev/null \
	    && command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ]; then \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; \
	fi
	touch $@

test: $(STAMP) $(CHROMIUM)
	$(BIN)/python -m pytest -q

# One-line mutations of the analyzer, curriculum, rewards and the loop's phases, each run against
# a fast subset of the tests in a copy of the tree; prints `survivors: N of M` (docs/testing.md).
mutate: $(STAMP)
	$(BIN)/python tools/mutate.py

lint: $(STAMP)
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) runs .pytest_cache
