#!/usr/bin/env bash
# System packages the Makefile needs (Debian/Ubuntu).
#   scripts/system-deps.sh venv   python3-venv: the .venv the Makefile builds
#   scripts/system-deps.sh test   that, and for the tests: openssh-client (the unreachable-node playbook test
#                                 connects over ssh), openssh-server and iproute2 (the molecule scenarios'
#                                 test hosts: sshd in network namespaces), slurmctld, slurmd, munge and
#                                 slurm-client (tests/test_slurm.py: a real Slurm on those test hosts), chromium
#                                 (tests/test_report_browser.py: the reports opened in headless Chromium)
#   scripts/system-deps.sh arm64  debootstrap and qemu-user-static: make test-arm64's arm64 test host
#
# Installs what is missing only when asked: CI=true (CI machines, .ci/run) or SYSTEM_DEPS=install
# (`make test SYSTEM_DEPS=install`), as root, with apt-get. Otherwise it names what is missing and how to
# install it: `venv` then fails (no .venv without python3-venv); `test` goes on, and the tests that need a
# missing tool skip, saying which. On a Slurm head node, installing Debian's slurmctld would start a second
# one beside the site's: the packages are installed with services kept from starting (policy-rc.d), and the
# tests start their own daemons in their own network namespaces (tests/slurm_cluster.py).
set -euo pipefail
what="${1:-test}"
missing=()
python3 -c 'import ensurepip, venv' 2>/dev/null || missing+=(python3-venv)
if [ "$what" = test ]; then
  command -v ssh >/dev/null || missing+=(openssh-client)
  command -v sshd >/dev/null || [ -x /usr/sbin/sshd ] || missing+=(openssh-server)
  command -v ip >/dev/null || [ -x /usr/sbin/ip ] || [ -x /sbin/ip ] || missing+=(iproute2)
  [ -x /usr/sbin/slurmctld ] || command -v slurmctld >/dev/null || missing+=(slurmctld)
  [ -x /usr/sbin/slurmd ] || command -v slurmd >/dev/null || missing+=(slurmd)
  [ -x /usr/sbin/munged ] || command -v munged >/dev/null || missing+=(munge)
  command -v scontrol >/dev/null || missing+=(slurm-client)
  command -v chromium >/dev/null || missing+=(chromium)
fi
if [ "$what" = arm64 ]; then
  command -v debootstrap >/dev/null || [ -x /usr/sbin/debootstrap ] || missing+=(debootstrap)
  [ -x /usr/bin/qemu-aarch64-static ] || missing+=(qemu-user-static)
fi
((${#missing[@]})) || exit 0

if [ "${CI:-}" != true ] && [ "${SYSTEM_DEPS:-}" != install ]; then
  echo "missing system packages: ${missing[*]}" >&2
  echo "  install them (Debian/Ubuntu: apt-get install ${missing[*]}), or as root run make again with" \
       "SYSTEM_DEPS=install (make test SYSTEM_DEPS=install)" >&2
  if [ "$what" = venv ]; then
    exit 1
  fi
  echo "  going on: the tests that need them skip, naming what is missing" >&2
  exit 0
fi
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null; then
  echo "missing system packages: ${missing[*]}; installing them needs root and apt-get" \
       "(Debian/Ubuntu: apt-get install ${missing[*]})" >&2
  exit 1
fi
# No service starts on install (slurmctld, slurmd, munge, ssh): invoke-rc.d and deb-systemd-invoke ask
# policy-rc.d, and 101 means "not allowed". A policy the machine already has is left as it is.
policy=/usr/sbin/policy-rc.d
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\n# scripts/system-deps.sh: no service starts while it installs packages\nexit 101\n' > "$policy"
  chmod 755 "$policy"
  trap 'rm -f "$policy"' EXIT
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}"
