# Two commands on a fresh machine: `make demo` and `make test`.
PY      := .venv/bin/python
PIP     := .venv/bin/pip
STAMP   := .venv/.installed
# The CPU build lying on this machine's disk; a GPU server keeps its own CUDA torch (pyproject says torch>=2.4).
TORCH   ?= torch==2.13.0

.PHONY: demo test bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv .venv
	$(PY) -c "import torch" 2>/dev/null || $(PIP) install -q "$(TORCH)"
	$(PIP) install -q -e ".[test]"
	touch $(STAMP)

demo: $(STAMP)
	.venv/bin/trainwise demo --out runs/demo --overwrite

test: $(STAMP)
	$(PY) -m pytest -q

bench: $(STAMP)
	$(PIP) install -q -e ".[test,bench]"
	$(PIP) install -q --no-deps "litdata>=0.2" lightning-utilities
	$(PIP) install -q boto3 requests filelock
	for f in benchmarks/*.py; do echo "== $$f"; $(PY) $$f || exit 1; done

clean:
	rm -rf .venv runs
