# Two commands on a fresh machine (from any directory: make -C path/to/repo <target>):
#   make quickstart   an environment, then the three methods end to end on a CPU, with a summary
#   make test         what the tests need, then the default and the slow suites (what CI runs)
# The environment: the active virtualenv or this Python when they already hold the requirements,
# else .venv/ (created here; installing needs the network once: PyPI and PyTorch's CPU wheel index).
# After it, run the scripts with .venv/bin/python (.venv/bin/torchrun), or `source .venv/bin/activate`.
# Offline, with the requirements installed, both targets run without any download.

ROOT := $(abspath $(dir $(lastword $(MAKEFILE_LIST))))
VENV := $(ROOT)/.venv
TORCH := torch==2.13.0
TORCH_INDEX := https://download.pytorch.org/whl/cpu
SYS_PY := $(shell command -v python3 || command -v python)
PY = $(shell if [ -x "$(VENV)/bin/python" ]; then echo "$(VENV)/bin/python"; else echo "$(SYS_PY)"; fi)
PIP_QUIET := --quiet --disable-pip-version-check

.PHONY: quickstart test test-default test-slow env env-dev clean-quickstart

quickstart: env
	cd "$(ROOT)" && "$(PY)" experiments/quickstart.py

test: env-dev test-default test-slow

test-default:
	cd "$(ROOT)" && HF_HUB_OFFLINE=1 "$(PY)" -m pytest -q -m "not slow" --durations=15

test-slow:
	cd "$(ROOT)" && HF_HUB_OFFLINE=1 "$(PY)" -m pytest -q -m slow --durations=15

# The runtime requirements: nothing to do when the current Python imports them all; otherwise a
# .venv with the CPU build of torch first (an unpinned `pip install torch` pulls a multi-GB CUDA
# build; on a GPU machine install the CUDA build yourself), then requirements.txt. The CPU build
# lives on PyTorch's own wheel index; where that index cannot be reached (10 s), one line says so and
# pip's configured sources are used instead (pip would retry the index for minutes, ~70 lines).
env:
	@cd "$(ROOT)" && if "$(PY)" -c "import torch, numpy, tiktoken, tokenizers, tqdm, pyarrow, scipy" 2>/dev/null; then \
	    echo "using $(PY) (it has the requirements)"; \
	else \
	    echo "creating $(VENV) and installing the requirements (needs the network once)"; \
	    "$(SYS_PY)" -m venv "$(VENV)" && \
	    if "$(VENV)/bin/python" -c "import urllib.request; urllib.request.urlopen('$(TORCH_INDEX)/torch/', timeout=10)" 2>/dev/null; then \
	        echo "$(TORCH) (CPU build) from $(TORCH_INDEX)" && \
	        "$(VENV)/bin/python" -m pip install $(PIP_QUIET) $(TORCH) --index-url $(TORCH_INDEX); \
	    else \
	        echo "$(TORCH_INDEX) cannot be reached: $(TORCH) from pip's configured indexes instead" && \
	        "$(VENV)/bin/python" -m pip install $(PIP_QUIET) $(TORCH); \
	    fi && \
	    "$(VENV)/bin/python" -c "import torch; print('installed torch', torch.__version__, '(a CUDA build: its libraries take several GB)' if torch.version.cuda else '(the CPU build)')" && \
	    "$(VENV)/bin/python" -m pip install $(PIP_QUIET) -r requirements.txt && \
	    echo "installed into $(VENV): run the scripts with .venv/bin/python (and .venv/bin/torchrun), or after source .venv/bin/activate" || \
	    { echo "error: could not install the requirements into $(VENV) (no network?): install them with pip, then run make again"; exit 2; }; \
	fi

# What the tests need on top: pytest and the numerical references (requirements-dev.txt).
env-dev: env
	@cd "$(ROOT)" && if "$(PY)" -c "import pytest, transformers, pytrec_eval, sentence_transformers" 2>/dev/null; then \
	    echo "using $(PY) (it has the test requirements)"; \
	else \
	    echo "installing the test requirements (requirements-dev.txt: pytest, transformers, pytrec_eval, sentence-transformers, matplotlib) for $(PY)" && \
	    "$(PY)" -m pip install $(PIP_QUIET) $(TORCH) && "$(PY)" -m pip install $(PIP_QUIET) -r requirements-dev.txt || \
	    { echo "error: could not install requirements-dev.txt (no network?): install it with pip, then run make again"; exit 2; }; \
	fi

clean-quickstart:
	rm -rf "$(ROOT)/out/quickstart"
