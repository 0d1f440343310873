# The two commands a new user needs (see README.md):
#   make lab    bring the lab up and run the main job (site.yml) on it
#   (make lab-vllm: the same two nodes serving a tiny model with the real vLLM engine, CPU build)
#   make test   the whole suite: linters, ansible-test sanity, unit tests, the stand-ins, lab acceptance,
#               molecule (the stand-in engine's labs and, beside them, the real engine's)
# Both work from a fresh clone as root: they install what they need.

SHELL := /bin/bash
VENV := .venv
BIN := $(CURDIR)/$(VENV)/bin
export PATH := $(BIN):$(PATH)
# Tests and the lab never talk to a real hub or registry.
export HF_HUB_DISABLE_XET := 1
export HF_HUB_DISABLE_TELEMETRY := 1

.PHONY: molecule-default molecule-beside molecule-real-engine lab lab-vllm lab-up lab-down test lint sanity unit standins lab-test molecule deps engine tools images

deps: $(VENV)/.installed

$(VENV)/.installed: requirements.txt requirements-dev.txt
	python3 -m venv $(VENV)
	$(BIN)/pip install --quiet --no-compile --requirement requirements-dev.txt
	touch $@

# apt takes one install at a time: both targets that may install need this one first.
tools:
	python3 lab/labctl.py tools

engine: tools
	python3 lab/labctl.py engine

# The lab's images (three debootstraps on a new machine, and vLLM's CPU build from its locked
# wheels), built beside the checks that need no lab.
images: engine
	python3 lab/labctl.py images --vllm

lab: deps lab-up
	ansible-playbook site.yml -i inventory/lab

# The real engine: vLLM's CPU build and a tiny trained model, through inventory/lab-vllm and its recipe,
# on the second lab (the inventory's lab_instance), which runs beside the first.
lab-vllm: deps
	SPARKSERVE_LAB_INSTANCE=1 python3 lab/labctl.py up --vllm
	ansible-playbook site.yml -i inventory/lab-vllm/hosts.yml

lab-up:
	python3 lab/labctl.py up

lab-down:
	python3 lab/labctl.py down
	SPARKSERVE_LAB_INSTANCE=1 python3 lab/labctl.py down

# The checks that need no lab run side by side with the build of the lab's images and, once they
# are built, the lab's acceptance tests (which mostly wait on containers; make prints each one's
# output whole when it ends), then the suites that measure time, one at a time: the stand-ins'
# throughput tests fail when they share the cores.
test: deps
	$(MAKE) --jobs --output-sync=target lab-test lint sanity unit
	$(MAKE) standins molecule

lint: deps
	ruff check .
	ruff format --check .
	yamllint --strict .
	ansible-lint
	ansible-galaxy collection build --force --output-path build/ >/dev/null

# ansible-test sanity (all 24 tests, ansible-doc and validate-modules among them) on the working
# tree's collection files, in a temporary copy; see tests/sanity/run.sh. The shellcheck program
# it needs comes from PyPI (tests/sanity/requirements.txt).
sanity: deps
	pip install --quiet --requirement tests/sanity/requirements.txt
	tests/sanity/run.sh

# checkpoint_copy's tests run the real rsync.
unit: deps tools
	pytest tests/unit

# The lab's stand-ins as real processes on loopback (engine, hub, smoke and bench against them).
standins: deps
	pytest tests/standins

lab-test: deps images
	pytest tests/lab

# Two labs side by side: on lab 0 the stand-in engine's default scenario (the DeepSeek recipe, the
# longest); beside it the real engine's (lab 1, recipe tiny-chat), then the three nodes' (lab 2).
# make prints each one's output whole when it ends.
molecule: deps images
	$(MAKE) --jobs=2 --output-sync=target molecule-default molecule-beside

molecule-default: deps engine
	molecule test --scenario-name default

# The three nodes' lab starts and stops ranks: it holds the machine shared, as the real-engine
# cases do, so that the default suite's cases that measure against the machine wait for it.
molecule-beside: deps engine
	molecule test --scenario-name real-engine
	mkdir -p .lab && flock --shared .lab/machine.lock molecule test --scenario-name three-nodes

# The real engine's scenario alone.
molecule-real-engine: deps engine
	molecule test --scenario-name real-engine
