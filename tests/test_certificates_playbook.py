"""A real `gpufleet fleet run -i inventory/local --certify-key KEY` (validate.yml through ansible-runner) on this
machine: no GPU, so its node is not accepted, and `gpufleet certify` after the report says so; the private key's
material is in no file of the reports folder, the runner's files or the evidence bundle made from the run. A key open
to others is refused before any node is touched."""

from __future__ import annotations

import json
import os
import subprocess
import tarfile
from pathlib import Path

import pytest

from playbooks import BIN

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]


def fleet_run(tmp_path: Path, run_id: str, key: Path) -> subprocess.CompletedProcess:
    (tmp_path / "tmp").mkdir(exist_ok=True)
    env = dict(
        os.environ,
        PATH=f"{BIN}:{os.environ['PATH']}",
        ANSIBLE_LOCAL_TEMP=str(tmp_path / "ansible-tmp"),
        TMPDIR=str(tmp_path / "tmp"),
    )
    return subprocess.run(
        [str(BIN / "gpufleet"), "fleet", "run", "-i", "inventory/local", "--plain", "--json"]
        + ["--run-id", run_id, "--reports-dir", str(tmp_path / "reports"), "--certify-key", str(key)]
        + ["-e", '{"gpufleet_benchmarks": []}', "-e", f"gpufleet_lock_path={tmp_path / 'node.lock'}"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
    )


def key_material(key: Path) -> list[bytes]:
    pem = key.read_text()
    body = "".join(line for line in pem.splitlines() if "-----" not in line)
    return [b"PRIVATE KEY", body.encode(), body[:40].encode()]


def holding(folder: Path, needles: list[bytes]) -> list[str]:
    return [str(p) for p in folder.rglob("*") if p.is_file() and any(n in p.read_bytes() for n in needles)]


def test_a_run_with_a_key_certifies_after_the_report_and_copies_no_key(tmp_path):
    key = tmp_path / "keys" / "site.key"
    subprocess.run([str(BIN / "gpufleet"), "keygen", str(key)], check=True, capture_output=True)
    done = fleet_run(tmp_path, "signed", key)
    out = done.stdout + done.stderr
    assert done.returncode == 1, out  # no GPU here: the node is not accepted
    record = json.loads((tmp_path / "reports" / "signed" / "certificates" / "certify.json").read_text())
    assert record["certified"] == {} and record["not_certified"]["localhost"].startswith("not accepted (verdict fail")
    needles = key_material(key)
    assert holding(tmp_path / "reports", needles) == []
    assert holding(tmp_path / "tmp", needles) == [] and holding(tmp_path / "ansible-tmp", needles) == []
    bundle = tmp_path / "evidence.tar.gz"
    made = subprocess.run(
        [str(BIN / "gpufleet"), "evidence", "localhost", "--reports-dir", str(tmp_path / "reports")]
        + ["--out", str(bundle), "--bug-report-command", "true"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert made.returncode == 0, made.stderr
    with tarfile.open(bundle) as tar:
        members = [tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()]
    assert members and not [m for m in members if any(n in m for n in needles)]


def test_a_key_open_to_others_is_refused_before_any_node(tmp_path):
    key = tmp_path / "site.key"
    subprocess.run([str(BIN / "gpufleet"), "keygen", str(key)], check=True, capture_output=True)
    key.chmod(0o644)
    done = fleet_run(tmp_path, "refused", key)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "gpufleet_certify_key" in done.stderr and "has mode 0644" in done.stderr, done.stderr
    assert not (tmp_path / "reports" / "refused").exists()
