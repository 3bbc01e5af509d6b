"""`gpufleet fleet run` in the environment an operator's shell gives it: Ansible's verbosity set (ANSIBLE_VERBOSITY,
or `verbosity` in an ansible.cfg), and -e @FILE of a file ansible-vault encrypted, its password in
ANSIBLE_VAULT_PASSWORD_FILE, as ansible-playbook takes it.

Real runs of validate.yml over inventory/local through ansible-runner (this machine, no GPU: the node is not
accepted, exit 1), the vault file made by ansible-vault itself.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from test_exit_cases import fleet_run

pytest.importorskip("ansible_runner")

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
TOKEN = "hf_vaulted_3b1c5e"
LOCAL = ("-i", "inventory/local", "--run-id")  # then the run id


@pytest.fixture
def vault(tmp_path) -> tuple[Path, Path]:
    """(a vars file encrypted by ansible-vault, the file holding its password)."""
    password = tmp_path / "vault-pass"
    password.write_text("correct horse\n")
    path = tmp_path / "vault.yml"
    path.write_text(f"gpufleet_benchmarks: []\ngpufleet_node_env:\n  HF_TOKEN: {TOKEN}\n")
    subprocess.run(
        [str(BIN / "ansible-vault"), "encrypt", "--vault-password-file", str(password), str(path)],
        check=True,
        capture_output=True,
        timeout=60,
    )
    assert path.read_text().startswith("$ANSIBLE_VAULT;") and TOKEN not in path.read_text()
    return path, password


def test_verbosity_in_the_environment_and_a_vault_encrypted_extra_vars_file(tmp_path, vault):
    path, password = vault
    proc, line = fleet_run(
        tmp_path, *LOCAL, "env", "-e", f"@{path}", ANSIBLE_VERBOSITY="2", ANSIBLE_VAULT_PASSWORD_FILE=str(password)
    )
    assert proc.returncode == 1 and line["nodes"] == {"localhost": "not accepted"}, proc.stderr[-3000:]
    run_dir = tmp_path / "reports" / "env"
    doc = json.loads((run_dir / "hosts" / "localhost.json").read_text())
    # The vault's gpufleet_benchmarks: [] reached the playbook: the node stage ran no benchmark.
    assert doc["results"] and not [r for r in doc["results"] if r["group"] == "benchmark"]
    record = json.loads((run_dir / "runner" / "runner.json").read_text())
    assert "gpufleet_node_env" in record["invocations"][0]["extravars_withheld"]
    # The decrypted token is in no file of the run and in no output.
    assert TOKEN not in proc.stdout + proc.stderr
    assert not [p for p in run_dir.rglob("*") if p.is_file() and TOKEN.encode() in p.read_bytes()]


def test_verbosity_in_an_ansible_cfg(tmp_path):
    config = tmp_path / "ansible.cfg"
    config.write_text(
        (REPO / "ansible.cfg")
        .read_text()
        .replace("collections_path = ./collections", f"collections_path = {REPO / 'collections'}")
        .replace("[defaults]\n", "[defaults]\nverbosity = 2\n")
    )
    proc, line = fleet_run(tmp_path, *LOCAL, "cfg", "-e", '{"gpufleet_benchmarks": []}', ANSIBLE_CONFIG=str(config))
    assert proc.returncode == 1 and line["nodes"] == {"localhost": "not accepted"}, proc.stderr[-3000:]
    assert (tmp_path / "reports" / "cfg" / "report.json").is_file()


def test_a_vault_file_without_its_password_is_refused_saying_how_to_give_it(tmp_path, vault):
    path, _ = vault
    wrong = tmp_path / "wrong-pass"
    wrong.write_text("not it\n")
    for env, why in (
        ({}, "no vault secrets found"),
        ({"ANSIBLE_VAULT_PASSWORD_FILE": str(wrong)}, "Decryption failed"),
    ):
        proc, line = fleet_run(tmp_path, *LOCAL, "nopass", "-e", f"@{path}", **env)
        assert proc.returncode == 2 and line["status"] == "refused", proc.stderr[-3000:]
        assert f"-e @{path}: {path} is vault-encrypted and could not be decrypted (" in line["message"]
        assert why in line["message"]
        assert "ANSIBLE_VAULT_PASSWORD_FILE" in line["message"]
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not (tmp_path / "reports" / "nopass").exists()
