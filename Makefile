# make validate   check this machine (inventory/local) and print where the report is
# make test       pytest over pyproject.toml's testpaths, ansible-lint and ansible-test sanity included (CI's command)
# make test-fast  the tests not marked slow: minutes, for the loop of a change
# make test-arm64 bringup.yml twice on an arm64 test host, emulated (tests/test_bringup_arm64.py): not in make test
# make generate   write the files made from others: role specs and checks.md's tables (registry), sanity ignores
#
# Both create .venv with `python3 -m venv` and install the project into it the
# first time. INVENTORY=inventory/<site> and ARGS='-e ... --limit ...' pass
# through to ansible-playbook. On inventory/local, make validate first says which
# Python the node side runs (one with torch, CUDA and nvidia-ml-py when the machine
# has it; NODE_PYTHON=... to choose) and how many GPUs it expects (EXPECTED_GPUS=N).
# System packages (python3-venv; for the tests ssh,
# sshd, iproute2, Slurm's daemons, munge) are installed only when asked:
# SYSTEM_DEPS=install, or CI=true on a CI machine; otherwise make names what is
# missing and the tests that need it skip, saying so.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
INVENTORY ?= inventory/local
# The CPU build of torch for the tests; the version the CI machines hold on disk.
TORCH_SPEC ?= torch==2.13.0
ARGS ?=
NODE_PYTHON ?=
EXPECTED_GPUS ?=
LOCAL_NODE := $(VENV)/local-node.json
# install: apt-get what is missing (as root; also when CI=true). Empty: only say what is missing.
SYSTEM_DEPS ?=
DEPS := SYSTEM_DEPS='$(SYSTEM_DEPS)' bash scripts/system-deps.sh

# The ansible-core the collection claims (meta/runtime.yml, pyproject.toml), each run with the README's command by
# tests/test_ansible_versions.py: the lowest and the highest in a venv of their own with the controller extra (the
# highest on Python 3.12: NEWER_PYTHON, else python3.12 or python3.13 on PATH, else pyenv's); the others ansible-core
# alone over one of them (PYTHONPATH=.ansible-core/X.Y; seconds to install, no venv): the newest of each minor between
# over the lowest, Ubuntu 24.04's own over the highest, whose Python is the 3.12 Ubuntu 24.04 ships.
ANSIBLE_LOWEST := 2.16.0
ANSIBLE_UBUNTU := 2.16.3
ANSIBLE_HIGHEST := 2.20
NEWER_PYTHON ?=
# Exits 3 when no Python fits: the tests that need it skip, saying so.
FIND_PYTHON := $(PYTHON) scripts/find_python.py

.PHONY: validate test test-fast test-arm64 lint sanity generate clean system-deps

$(BIN)/python:
	$(DEPS) venv
	$(PYTHON) -m venv $(VENV)

# python3-venv, ssh, sshd, iproute2, Slurm's daemons and munge: installed when missing with SYSTEM_DEPS=install or
# CI=true (apt-get, as root, no service started); otherwise named, and the tests that need them skip.
system-deps:
	$(DEPS) test

# A stamp per extra: pyproject.toml changes reinstall.
$(VENV)/.installed-controller: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e '.[controller]'
	touch $@

$(VENV)/.installed-test: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q '$(TORCH_SPEC)'
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $@ $(VENV)/.installed-controller

# Kept between runs (rebuilt when pyproject.toml changes); make clean removes them.
.venv-ansible-lowest/.installed: pyproject.toml
	$(PYTHON) -m venv $(@D)
	$(@D)/bin/python -m pip install -q -e '.[controller]' 'ansible-core==$(ANSIBLE_LOWEST)'
	touch $@

.venv-ansible-highest/.installed: pyproject.toml
	py=$$($(FIND_PYTHON) --from 3.12 $(NEWER_PYTHON) python3.12 python3.13) || exit 3; \
	"$$py" -m venv $(@D) && $(@D)/bin/python -m pip install -q -e '.[controller]' 'ansible-core==$(ANSIBLE_HIGHEST).*'
	touch $@

# .ansible-core/2.17/.installed: the newest 2.17, for the lowest venv's Python.
.ansible-core/%/.installed: .venv-ansible-lowest/.installed
	rm -rf $(@D)
	.venv-ansible-lowest/bin/python -m pip install -q --no-deps --target $(@D) 'ansible-core==$*.*'
	touch $@

# Ubuntu 24.04's ansible-core, on the Python it ships (3.12): the highest venv's, when it is that.
.ansible-core/$(ANSIBLE_UBUNTU)/.installed: .venv-ansible-highest/.installed
	@.venv-ansible-highest/bin/python -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' || { \
	  echo "ansible-core $(ANSIBLE_UBUNTU) as Ubuntu 24.04 has it runs on Python 3.12, not .venv-ansible-highest's:" \
	    "rm -rf .venv-ansible-highest, then NEWER_PYTHON=<a Python 3.12>" >&2; exit 3; }
	rm -rf $(@D)
	.venv-ansible-highest/bin/python -m pip install -q --no-deps --target $(@D) 'ansible-core==$(ANSIBLE_UBUNTU)'
	touch $@

# Exits non-zero when a node fails acceptance (on a machine without a GPU it does). The report named at the end is
# the one this run made (none under --check).
validate: $(VENV)/.installed-controller
	@local=; if [ "$(INVENTORY)" = inventory/local ]; then \
	  $(BIN)/python scripts/local_node.py --out $(LOCAL_NODE) --node-python "$(NODE_PYTHON)" --expected-gpus "$(EXPECTED_GPUS)" \
	    || exit 2; \
	  local="-e @$(LOCAL_NODE)"; fi; \
	before=$$(ls -td reports/*/ 2>/dev/null | head -n 1); \
	rc=0; PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/ansible-playbook validate.yml -i $(INVENTORY) $$local $(ARGS) || rc=$$?; \
	run=$$(ls -td reports/*/ 2>/dev/null | head -n 1); \
	if [ -n "$$run" ] && [ "$$run" != "$$before" ]; then \
	  echo "report: $(CURDIR)/$${run}report.html (and report.md, report.json, junit.xml)"; fi; \
	exit $$rc

test: system-deps $(VENV)/.installed-test
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m pytest -n 2 --dist loadfile

# bringup.yml twice on an arm64 test host: an arm64 Debian userland (debootstrap) whose programs run through QEMU's
# user-mode emulator in a user namespace of the host's own (tests/arm64_root.py). The first run builds that userland
# (26 min on 2 shared cores, Debian's mirror and PyPI); under emulation every module is slow, so bring-up twice takes
# about 9 min, too long for make test, which skips it saying so.
test-arm64: $(VENV)/.installed-test
	$(DEPS) arm64
	GPUFLEET_ARM64=1 PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m pytest -n 0 -v tests/test_bringup_arm64.py

# No playbook, test host, Slurm, browser or torch process: pyproject.toml's `slow` marker says which tests are left out.
test-fast: $(VENV)/.installed-test
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m pytest -n 2 --dist loadfile -m "not slow"

# Files written from others, each held current by a test: what Ansible lists of the engine's registry (the role's
# argument specs and the modules' choices: tools/generate.py; tests/test_generated.py) and the ansible-test sanity
# ignore files, from the modules and the engine's files the collection ships (tools/sanity_ignores.py;
# tests/test_collection_conventions.py).
generate:
	$(PYTHON) tools/generate.py
	$(PYTHON) tools/sanity_ignores.py

lint: $(VENV)/.installed-test
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m pytest tests/test_ansible_quality.py -k lint

sanity: $(VENV)/.installed-test
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m pytest tests/test_ansible_quality.py -k sanity

clean:
	rm -rf $(VENV) .venv-ansible-lowest .venv-ansible-highest .ansible-core .ansible .pytest_cache
