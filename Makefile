# The two commands that matter on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | sha1sum | cut -c1-10)

.PHONY: install demo test lint format bench clean vscode

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# The CPU wheel of torch 2.13 (an unpinned torch would pull a multi-GB CUDA build).
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[test]'
	rm -f $(VENV)/.installed-*
	touch $@

install: $(STAMP)

demo: install
	$(PY) examples/demo.py

# The suite runs in two processes (pytest-xdist), each taking one test module at a time
# so that a module's captured fixtures are built once. Each run gets an empty TMPDIR and
# Inductor cache of its own, removed afterwards: it neither reuses nor fills the
# machine's (Inductor keeps precompiled headers under TMPDIR, whatever
# TORCHINDUCTOR_CACHE_DIR says). Options: make test TEST_WORKERS=1 PYTEST_ARGS="-k lsp".
TEST_WORKERS ?= 2
PYTEST_ARGS ?=
test: install
	@run=$$(mktemp -d -t precompile-test-XXXXXX) && mkdir $$run/tmp $$run/inductor && \
	export TMPDIR=$$run/tmp TORCHINDUCTOR_CACHE_DIR=$$run/inductor && \
	$(MAKE) --no-print-directory vscode && \
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS); \
	status=$$?; rm -rf $$run; exit $$status

# The VS Code extension (editor/vscode): type-check, bundle, unit tests, a strict-framing
# smoke test against the real server, and the .vsix (needs Node 20 and npm).
vscode: install
	cd editor/vscode && npm ci && PRECOMPILE_PYTHON=$(abspath $(PY)) npm run ci

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: install
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

bench: install
	$(PY) bench/run.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache
