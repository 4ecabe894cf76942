# The two commands that matter on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | sha1sum | cut -c1-10)

.PHONY: install demo test lint format bench clean vscode e2e

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

# The suite runs in three processes (pytest-xdist), each taking one test module at a time
# so that a module's captured fixtures are built once; three on two cores, since about a
# fifth of a worker's time is spent waiting on the fresh processes its tests start. Each run gets an empty TMPDIR and
# Inductor cache of its own, removed afterwards: it neither reuses nor fills the
# machine's (Inductor keeps precompiled headers under TMPDIR, whatever
# TORCHINDUCTOR_CACHE_DIR says). The extension's checks (`make vscode`, which no test
# reads) run alongside the tests, in the time their workers wait; their output follows
# the tests' (whole where they fail), and either failing fails the run.
# The repository's own modules are compiled to bytecode first: the suite starts hundreds
# of processes that import them, each compiling about 40,000 lines from source where
# PYTHONDONTWRITEBYTECODE is set (a quarter of a second each). Checked-hash .pyc files
# are checked against the source's hash on every import, so an edit is never run stale;
# the workspaces under tests/fixtures/ are copied by tests and left without any. A file
# that does not compile is left to the tests to report.
# Options: make test TEST_WORKERS=1 PYTEST_ARGS="-k lsp".
TEST_WORKERS ?= 3
PYTEST_ARGS ?=
test: install
	@$(PY) -m compileall -q -j 0 --invalidation-mode checked-hash -x 'tests/fixtures/[^/]+/' \
		core/precompile server/precompile_lsp tests tools > /dev/null; \
	run=$$(mktemp -d -t precompile-test-XXXXXX) && mkdir $$run/tmp $$run/inductor && \
	export TMPDIR=$$run/tmp TORCHINDUCTOR_CACHE_DIR=$$run/inductor || exit 1; \
	{ $(MAKE) --no-print-directory vscode > $$run/vscode.log 2>&1; echo $$? > $$run/vscode.status; } & \
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS); \
	status=$$?; wait; vscode=$$(cat $$run/vscode.status 2>/dev/null || echo 1); \
	if [ "$$vscode" -ne 0 ]; then cat $$run/vscode.log; echo "make vscode failed (exit $$vscode)"; \
	else echo "make vscode (alongside): type-check, bundle, unit and smoke tests, .vsix: ok"; fi; \
	rm -rf $$run; [ $$status -ne 0 ] && exit $$status; exit $$vscode

# The VS Code extension (editor/vscode): type-check, bundle, unit tests, a strict-framing
# smoke test against the real server, and the .vsix (needs Node 20 and npm).
vscode: install
	cd editor/vscode && npm ci && PRECOMPILE_PYTHON=$(abspath $(PY)) npm run ci

# The extension in a real VS Code (README, "Testing"): code-server from npm in .e2e/,
# Debian's Chromium driven by Playwright from PyPI, the .vsix built from this checkout.
# Idempotent: what is installed already is skipped. Screenshots: .e2e/out/<scenario>/.
E2E := .e2e
CODE_SERVER_VERSION := 4.100.3
# Chromium for Playwright; ripgrep stands in for the rg code-server would download;
# libkrb5-dev, g++ and make build code-server's native modules; a font for the pages.
E2E_APT := chromium ripgrep libkrb5-dev g++ make fonts-dejavu-core

editor/vscode/node_modules/.package-lock.json: editor/vscode/package-lock.json
	cd editor/vscode && npm ci

e2e: install editor/vscode/node_modules/.package-lock.json
	dpkg -s $(E2E_APT) >/dev/null 2>&1 || { apt-get update && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $(E2E_APT); }
	tests/e2e/install-code-server.sh $(E2E)/code-server $(CODE_SERVER_VERSION)
	$(PY) -c 'import playwright' 2>/dev/null || $(PY) -m pip install -q -e '.[e2e]'
	cd editor/vscode && npm run package
	$(PY) -m pytest --e2e -p no:cacheprovider -q tests/e2e

# ruff, the layering contracts ([tool.importlinter]) and the type checker ([tool.mypy]:
# core/precompile and server/precompile_lsp, every type: ignore with its reason).
lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports
	$(VENV)/bin/python tools/private_names.py
	$(VENV)/bin/mypy

format: install
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

bench: install
	$(PY) bench/run.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache $(E2E)
