# Sourced by the GPU scripts (tools/gpu_bringup.sh, tools/gpu_nccl_settings.sh) on machines without ansible-core:
# installs the wheels in .whl (tools/gpu_wheelhouse.sh) into a folder of their own and puts ansible-playbook and
# ansible on PATH as wrappers that alone see that folder. PYTHONPATH would reach every module, pip and engine process
# the playbooks start, and the environment python_env builds would see those packages as its own.
# Usage: . tools/ansible_from_wheels.sh LOG_FILE    (returns non-zero when the wheels would not install)
ansible_from_wheels() {
  local log=$1 site=/tmp/gpufleet-ansible cli
  command -v ansible-playbook >/dev/null && return 0
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site/lib" \
    .whl/*.whl >"$log" 2>&1 || return 1
  mkdir -p "$site/bin"
  for cli in ansible-playbook:playbook ansible:adhoc; do
    cat >"$site/bin/${cli%%:*}" <<WRAPPER
#!/bin/sh
exec $(command -v python3) -c 'import sys; sys.path.insert(0, "$site/lib"); sys.argv[0] = "${cli%%:*}"; from ansible.cli.${cli#*:} import main; main()' "\$@"
WRAPPER
    chmod +x "$site/bin/${cli%%:*}"
  done
  export PATH=$site/bin:$PATH
}
ansible_from_wheels "$1"
