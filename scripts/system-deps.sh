#!/usr/bin/env bash
# System packages, installed when missing (Debian/Ubuntu, as root).
#   scripts/system-deps.sh venv   python3-venv: the .venv the Makefile builds
#   scripts/system-deps.sh test   that, and for the tests: openssh-client (the unreachable-node playbook test
#                                 connects over ssh), openssh-server and iproute2 (the molecule scenarios'
#                                 test hosts: sshd in network namespaces), slurmctld, slurmd, munge and
#                                 slurm-client (tests/test_slurm.py: a real Slurm on those test hosts)
set -euo pipefail
missing=()
python3 -c 'import ensurepip, venv' 2>/dev/null || missing+=(python3-venv)
if [ "${1:-test}" = test ]; then
  command -v ssh >/dev/null || missing+=(openssh-client)
  command -v sshd >/dev/null || [ -x /usr/sbin/sshd ] || missing+=(openssh-server)
  command -v ip >/dev/null || [ -x /usr/sbin/ip ] || [ -x /sbin/ip ] || missing+=(iproute2)
  [ -x /usr/sbin/slurmctld ] || command -v slurmctld >/dev/null || missing+=(slurmctld)
  [ -x /usr/sbin/slurmd ] || command -v slurmd >/dev/null || missing+=(slurmd)
  [ -x /usr/sbin/munged ] || command -v munged >/dev/null || missing+=(munge)
  command -v scontrol >/dev/null || missing+=(slurm-client)
fi
((${#missing[@]})) || exit 0
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null; then
  echo "missing system packages: ${missing[*]}; install them (Debian/Ubuntu: apt-get install ${missing[*]})" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}"
