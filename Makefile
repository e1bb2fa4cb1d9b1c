# `make demo`, `make test` (the suite but its slow tier) and `make test-slow` (the slow end-to-end
# tier: pytest marker `slow`; CI runs it after `make test`); `make test-fast`: the unit tier alone
# (tests/unit: no torch, no processes; seconds). All create .venv when it is missing.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.torchrepro-installed

.PHONY: demo test test-fast test-slow lint bench bytecode clean realworld compat gpu

# the editable install builds the C step codec in place (src/torchrepro/eventlog/_stepcodec*.so): again when its source changes
# (setuptools warns on every build that ext-modules is experimental: not the user's concern)
$(STAMP): export PYTHONWARNINGS = ignore:`[tool.setuptools.ext-modules]`
$(STAMP): pyproject.toml src/torchrepro/eventlog/_stepcodec.c
	@echo "torchrepro: setting up $(VENV) (once): torch 2.13.0 (CPU build) and torchrepro with the extras its tests and"
	@echo "  examples use (pytest, ruff, mypy, scikit-learn, lightning, transformers, accelerate, ray, OpenTelemetry):"
	@echo "  about 2 GB; a few minutes (1 to 8 measured on a 2-core machine), most of it fetching and unpacking the extras"
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@echo "  [1/3] pip"
	@$(PY) -m pip install -q --upgrade pip
	@echo "  [2/3] torch 2.13.0"  # exactly this torch: a bare `torch` would pull a multi-GB CUDA build
	@$(PY) -m pip install -q torch==2.13.0
	@echo "  [3/3] torchrepro (editable, its C step codec built in place) and the extras"
	@$(PY) -m pip install -q -e '.[dev,digits,tlparse,thirdparty,otel,fast,ray]'
	@touch $(STAMP)
	@echo "torchrepro: $(VENV) ready"

# Byte-compile torchrepro's sources as pip does for an installed package (incremental: only what
# changed). Where PYTHONDONTWRITEBYTECODE=1 is set (as on this project's machines), nothing else
# writes them, and every process a run or the suite starts would compile them again (~0.15 s each).
bytecode: $(STAMP)
	$(PY) -m compileall -q src

demo: bytecode
	$(PY) examples/demo.py

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests bench examples gpu
	$(VENV)/bin/ruff format --check src tests bench examples gpu
	$(VENV)/bin/mypy  # what it checks and how strictly: [tool.mypy] in pyproject.toml

# the unit tier (tests/unit/conftest.py refuses torch and processes there: complete only in a pytest of its own)
test-fast: bytecode
	$(PY) -m pytest -n 2 -q -m "not slow and not realworld" tests/unit

# lint, the unit tier, then the end-to-end tier (tests/e2e) but its slow cases
test: lint test-fast
	$(PY) -m pytest -n 2 --dist loadgroup -q -m "not slow and not realworld" --durations=12 --ignore=tests/unit

# the end-to-end cases too slow for every `make test` (marker `slow`, pyproject.toml); CI runs both
test-slow: bytecode
	$(PY) -m pytest -n 2 --dist loadgroup -q -m "slow and not realworld" --durations=12

# The real-script corpus (realworld/, docs/evidence/accuracy.md): unmodified public training scripts, each checked
# three ways against ground truth (slow: minutes per script on a CPU); the table goes to build/realworld/table.md
realworld: bytecode
	$(PY) -m pytest -q -m "realworld or not realworld" tests/realworld -k "not three_checks"
	$(PY) realworld/run.py --table build/realworld/table.md

# The compat tier on the oldest and newest torch tested besides the pinned one (docs/evidence/compat.md): a venv
# per version, .venv-compat-<version> (a CUDA build, ~5 GB, run on CPU), then doctor's
# counts and categories against Dynamo's counters, TORCH_TRACE import, check's causes, non-perturbation
# and the distributed cases; then the inductor cases (marker inductor: doctor's counts against Dynamo's with
# backend inductor, check's inductor RNG and compiled-graph localisation). `make compat TORCH_VERSIONS=2.10.0`
# tests another.
TORCH_VERSIONS ?= 2.6.0 2.14.1
COMPAT_TESTS := tests/e2e/test_doctor_scenarios.py tests/e2e/test_compat.py tests/e2e/compat tests/e2e/test_check.py \
	tests/e2e/test_compile_counts.py \
	tests/e2e/test_distributed.py tests/e2e/test_doctor_cli.py::test_doctor_from_torch_trace_logs \
	tests/e2e/test_doctor_cli.py::test_observation_does_not_perturb
COMPAT_INDUCTOR := tests/e2e/compat/test_inductor_scenarios.py tests/e2e/test_check.py

.venv-compat-%/.torchrepro-installed: pyproject.toml
	test -x .venv-compat-$*/bin/python || $(PYTHON) -m venv .venv-compat-$*
	.venv-compat-$*/bin/python -m pip install -q --upgrade pip
	.venv-compat-$*/bin/python -m pip install -q torch==$*
	.venv-compat-$*/bin/python -m pip install -q -e '.[dev]'
	.venv-compat-$*/bin/python -m pip install -q "torch==$*" "$(or $(TRANSFORMERS_FOR_$*),transformers>=4.40)"
	touch $@

# the Hugging Face model of the counts test: transformers 5 needs a newer torch than 2.6
TRANSFORMERS_FOR_2.6.0 := transformers==4.49.0

compat: $(foreach v,$(TORCH_VERSIONS),.venv-compat-$(v)/.torchrepro-installed)
	set -e; for v in $(TORCH_VERSIONS); do \
		echo "== torch $$v"; \
		.venv-compat-$$v/bin/python -m pytest -n 2 --dist loadgroup -q -m "not inductor" $(COMPAT_TESTS); \
		.venv-compat-$$v/bin/python -m pytest -n 2 --dist loadgroup -q -m inductor $(COMPAT_INDUCTOR); \
	done

# The CUDA checks (gpu/check.py, docs/evidence/gpu.md): one line per check (PASS/FAIL/SKIP and what it measured),
# exit 1 on any FAIL; where no CUDA device is visible, one SKIP line and exit 2 (nothing was checked).
# Needs a CUDA build of torch in .venv; under 8 minutes on one GPU.
gpu: bytecode
	$(PY) gpu/check.py

bench: $(STAMP)
	$(PY) bench/fingerprint.py

clean:
	rm -rf $(VENV) torchrepro-runs .pytest_cache .mypy_cache
