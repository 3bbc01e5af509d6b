"""The evidence bundle a vendor reads (`gpufleet evidence`) and what keeps secrets out of it (service/redact.py),
over host documents the real engine made from recorded readings, in run folders as validate.yml leaves them: each
cause once, this fault's ladder steps, the GPU's figures and InfoROM, the nvidia-bug-report where the node has the
script, and every form of a secret the corpus holds removed by key, the JSON still JSON."""

from __future__ import annotations

import gzip
import json
import socket
import tarfile
from pathlib import Path

import pytest

import test_collect_dmi
from gpufleet.collect.host import dmi
from gpufleet.service.redact import REDACTED, Redactor
from service_runs import SERIAL, gpufleet, judged_run, readings


def bundle_files(path: Path) -> dict[str, bytes]:
    """{name under the archive's folder: its bytes, gz members decompressed}."""
    files = {}
    with tarfile.open(path) as tar:
        for member in tar.getmembers():
            raw = tar.extractfile(member).read()
            files[member.name.split("/", 1)[1]] = gzip.decompress(raw) if member.name.endswith(".gz") else raw
    return files


# Each form of a secret the issue found slipping through, and its relatives: (text, the key it is counted under,
# the secret). Every secret is unique, so a grep finds any that slipped.
SECRET_FORMS = [
    ("python train.py --hf-token hfsec-a1 --lr 3", "--hf-token", "hfsec-a1"),
    ("mysql --password pw-a2 -u root", "--password", "pw-a2"),
    ("mysql --password=pw-a3", "--password", "pw-a3"),
    ("DB_PASS=dbpass-a4 other=1", "DB_PASS", "dbpass-a4"),
    ("$conf = { 'token' => 'perl-a5', 'x' => 1 };", "token", "perl-a5"),
    ("ansible_ssh_pass: sshpass-a6", "ansible_ssh_pass", "sshpass-a6"),
    ("ansible_become_pass=become-a7", "ansible_become_pass", "become-a7"),
    ("ansible_become_password: 'become-a8'", "ansible_become_password", "become-a8"),
    ("vault_pass: vault-a9", "vault_pass", "vault-a9"),
    ("the vault said vaultenv-b1 here", "$VAULT_PASS", "vaultenv-b1"),
    ('{"api_token": ["list-b2", "list-b3"], "n": 3}', "api_token", "list-b2"),
    ('{"auth": {"token": "nested-b4", "api_key": 12345, "ok": true}}', "api_key", "12345"),
    ('export HF_TOKEN="hfexp-b5"', "HF_TOKEN", "hfexp-b5"),
    ("apiKey = 'camel-b6'", "apiKey", "camel-b6"),
    ("client_secret:plain-b7", "client_secret", "plain-b7"),
    ("Authorization: Bearer bearer-b8", "Authorization header", "bearer-b8"),
    ("clone https://u:urlpw-b9@h/x", "URL credentials", "urlpw-b9"),
    ("given on the command line: given-c1", "--redact", "given-c1"),
]
# The forms that leaked after it, and their relatives: (text, the key or form it is counted under, the secrets).
LEAKED_FORMS = [
    ("PGPASSWORD=pgpw-d1 psql -h db", "PGPASSWORD", ["pgpw-d1"]),
    ("secret_key_base: skb-d2", "secret_key_base", ["skb-d2"]),
    ("mysql -u root -pmypw-d3 db < dump.sql", "mysql -p", ["mypw-d3"]),
    ("mysqldump -pdump-d4 --all-databases", "mysql -p", ["dump-d4"]),
    ("db:\n  password: |\n    block-d5\n\n    block-d6\n  host: h1", "password", ["block-d5", "block-d6"]),
    ("- name: x\n  secret: >-\n    folded-d7\n    folded-d8\nnext: 1", "secret", ["folded-d7", "folded-d8"]),
    ("secrets:\n  - item-d9\n  - item-e1\nafter: 1", "secrets", ["item-d9", "item-e1"]),
    ("db_pass := go-e2", "db_pass", ["go-e2"]),
    ('password = @"objc-e3";', "password", ["objc-e3"]),
    (
        "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEA-e4\n-----END OPENSSH PRIVATE KEY-----",
        "private key",
        ["b3BlbnNzaC1rZXktdjEA-e4"],
    ),
    (
        "-----BEGIN PGP PRIVATE KEY BLOCK-----\nVersion: 1\n\nlQOYBGpgp-e5\n-----END PGP PRIVATE KEY BLOCK-----",
        "private key",
        ["lQOYBGpgp-e5"],
    ),
    ("-----BEGIN EC PRIVATE KEY-----\nMHcCAQEEIcut-e6", "private key", ["MHcCAQEEIcut-e6"]),
]
LIBRARY_EXAMPLES = json.loads((Path(__file__).parent / "data" / "detect-secrets-examples.json").read_text())


def test_redaction_removes_every_form_of_secret_by_key_keeps_json_and_figures():
    r = Redactor(["given-c1"], environ={"VAULT_PASS": "vaultenv-b1", "PWD": "/work", "HOME": "/root"})
    for text, key, secret in SECRET_FORMS:
        before = r.removed[key]
        out = r.text(text)
        assert secret not in out and REDACTED in out and r.removed[key] > before, (text, out, dict(r.removed))
        if text.startswith("{"):
            json.loads(out)  # still JSON
    assert "list-b3" not in r.text(SECRET_FORMS[10][0])
    # What is no secret stays: figures, words after a word, the working folder, a rate per token.
    kept = "tokens_per_s=5 flops_per_token=6 token expired; pass 3 of 5 /work"
    assert r.text(kept) == kept
    # A JSON document: the members whose key says secret, whatever they hold, at any depth; still JSON.
    doc = {"api_token": ["x1"], "b": {"secrets": {"a": "x2", "n": 5}}, "flops_per_token": 7, "password": 7, "ok": False}
    assert r.json(doc) == {
        "api_token": [REDACTED],
        "b": {"secrets": {"a": REDACTED, "n": REDACTED}},
        "flops_per_token": 7,
        "password": REDACTED,
        "ok": False,
    }
    assert r.json({"note": '{"api_token": ["x3"]}'}) == {"note": '{"api_token": ["[REDACTED]"]}'}
    assert set(r.removed) >= {key for _, key, _ in SECRET_FORMS} and "x1" not in json.dumps(dict(r.removed))


@pytest.mark.slow
def test_the_evidence_bundle_holds_what_a_vendor_asks_for_and_no_secret(tmp_path, monkeypatch):
    secrets = {
        "hf_TOKENtokenTOKENtoken1234",
        "Hunter2-admin-pass",
        "env-api-token-5678",
        "site-vault-pass-42",
        "bearer-xyz-0123",
    }
    reports = tmp_path / "reports"
    machine = dmi.read_dmi(test_collect_dmi.tree(tmp_path / "machine", test_collect_dmi.SYSFS), str(tmp_path / "none"))
    good = readings(tmp_path / "ok.json", dmi=machine)
    # The secrets come in where an operator's input or a node's log would bring them: a threshold value, a kernel
    # log line, the environment of the command, and the bug report the site's command prints.
    thresholds = json.dumps({"gpus_expected": 1, "driver_version": "password=Hunter2-admin-pass"})
    for i in (1, 2, 3):
        bad = readings(tmp_path / f"xid{i}.json", xids=i, note=" HF_TOKEN=hf_TOKENtokenTOKENtoken1234", dmi=machine)
        judged_run(reports, f"r{i}", {"n1": bad if i > 1 else good, "n2": good}, thresholds=thresholds, counters=True)
    monkeypatch.setenv("GPUFLEET_TEST_API_TOKEN", "env-api-token-5678")
    monkeypatch.setenv("VAULT_PASS", "vaultenv-b1")
    # The bug report prints every form of a secret the corpus holds, one a line.
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(f"{text}\n" for text, _, _ in SECRET_FORMS + LEAKED_FORMS))
    report_cmd = tmp_path / "bug-report"
    report_cmd.write_text(
        "#!/bin/sh\necho 'nvidia-bug-report.sh of' \"$1\"\necho 'Authorization: Bearer bearer-xyz-0123'\n"
        f"echo 'vault site-vault-pass-42 env-api-token-5678'\ncat {corpus}\n"
    )
    report_cmd.chmod(0o755)
    out = tmp_path / "evidence.tar.gz"
    done = gpufleet(
        "evidence",
        "n1",
        "--gpu",
        SERIAL,
        "--reports-dir",
        str(reports),
        "--out",
        str(out),
        "--bug-report-command",
        f"{report_cmd} {{host}}",
        "--redact",
        "site-vault-pass-42",
        "--redact",
        "given-c1",
        "--json",
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["runs"] == ["r2", "r3"] and result["redactions"] > 0
    files = {}
    with tarfile.open(out) as tar:
        for member in tar.getmembers():
            raw = tar.extractfile(member).read()
            files[member.name.split("/", 1)[1]] = gzip.decompress(raw) if member.name.endswith(".gz") else raw
    for name, raw in files.items():
        leaked = {secret for _, _, values in LEAKED_FORMS for secret in values}
        for secret in secrets | {secret for _, _, secret in SECRET_FORMS} | {"list-b3"} | leaked:
            assert secret.encode() not in raw, f"{secret} in {name}"
        if name.endswith(".json"):
            json.loads(raw)  # still JSON
    assert {
        "summary.md",
        "documents/r2/n1.json",
        "documents/r3/n1.json",
        "figures.md",
        "figures.json",
        "counters.md",
        "counters.json",
        "identity.json",
        "kernel_log.txt",
        "ladder.json",
        "slurm.json",
        "nvidia-bug-report.log.gz",
        "manifest.json",
    } <= set(files)
    summary = files["summary.md"].decode()
    assert f"serial {SERIAL}" in summary and "gpu_health.xid" in summary and "Since: run r2" in summary
    # Each finding with the component it is about and what to do about it; the machine and every GPU, whatever
    # --gpu asked; a version not read says why.
    assert f"    - component: GPU 0 SN {SERIAL}" in summary
    assert (
        "    - recommended action: reset (hardware that stands" in summary and "NVSentinel COMPONENT_RESET" in summary
    )
    assert (
        "- chassis: chassis_vendor Supermicro; chassis_type 23; chassis_serial C8210AB76500418; chassis_asset_tag not read"
        in summary
    )
    assert "- board: board_vendor Supermicro; board_name X13DEG-OAD; board_serial OM234567890" in summary
    assert "| 0 (this one) | GPU-" in summary and f"| {SERIAL} |" in summary
    assert "InfoROM not read (this collection holds no software readings" in summary
    assert json.loads(files["identity.json"])["machine"]["chassis_serial"] == "C8210AB76500418"
    assert (
        "- Slurm: no Slurm action recorded in the node's runs (slurm.json)" in summary
        and files["slurm.json"] == b"[]\n"
    )
    assert "Driver 580.159.04" in summary and "96.00.DA.00.0C" in files["identity.json"].decode()
    assert (
        "Xid (PCI:0000:00:06): 79" in files["kernel_log.txt"].decode() and REDACTED in files["kernel_log.txt"].decode()
    )
    xid = [c for c in json.loads(files["counters.json"]) if c["counter"] == "xid"]
    assert [(c["run_id"], c["after"], c["since_previous_run"]) for c in xid] == [
        ("r1", 0, None),
        ("r2", 2, 2),
        ("r3", 3, 1),
    ]
    assert json.loads(files["documents/r3/n1.json"])["host"] == "n1"  # still a document after redaction
    bug = files["nvidia-bug-report.log.gz"].decode()
    assert "nvidia-bug-report.sh of n1" in bug and REDACTED in bug
    manifest = json.loads(files["manifest.json"])
    assert set(manifest["files"]) == set(files) - {"manifest.json"}
    # What was removed, by key and by file, never the value.
    removed = manifest["removed"]
    assert {key for _, key, _ in SECRET_FORMS} <= set(removed["by_file"]["nvidia-bug-report.log.gz"])
    assert removed["by_file"]["kernel_log.txt"] == {"token format": 5} and removed["by_key"]["password"] >= 1
    assert sum(removed["by_key"].values()) == manifest["redactions"] == result["redactions"]
    assert result["removed"] == removed["by_key"] and "HF_TOKEN" in done.stdout


def test_redaction_removes_the_forms_that_leaked_and_every_example_of_the_detector_library():
    r = Redactor([], environ={"PWD": "/work/x", "HOME": "/root"})
    for text, key, secrets in LEAKED_FORMS:
        before = r.removed[key]
        out = r.text(text)
        assert not [s for s in secrets if s in out] and r.removed[key] > before, (text, out, dict(r.removed))
    # A YAML value over lines keeps the document's shape: its key, indicator and the keys after it.
    assert r.text(LEAKED_FORMS[4][0]) == "db:\n  password: |\n    [REDACTED]\n\n    [REDACTED]\n  host: h1"
    examples = LIBRARY_EXAMPLES["examples"]
    leaked = []
    for example in examples:
        out = r.text(example["text"])
        secrets = [example["secret"]] if "secret" in example else example["secrets"]
        leaked += [(example["detector"], example["text"][:80], s) for s in secrets if s in out]
    assert not leaked, leaked
    assert len(examples) == 246 and {e["detector"] for e in examples} >= {"keyword", "aws_key", "private_key", "jwt"}
    # What a vendor needs stays: a GPU's UUID, serial, PCI address, VBIOS, a checksum, a commit, an address, the
    # working folder; a path under a key the keyword list names does not (password_file).
    kept = (
        'uuid="GPU-8f2e0b8c-1d2e-4f3a-9b8c-7d6e5f4a3b2c" serial="1652321000123" 0000:1b:00.0 vbios 96.00.89.00.01 '
        'sha256 "3f786850e387550fdab836ed7e6dc881de23001b" commit "e2c4f1a9b7d3" 10.1.2.3 PWD /work/x'
    )
    assert r.text(kept) == kept
    assert r.text('{"password_file": "/etc/p"}') == '{"password_file": "[REDACTED]"}'


def summary_of(files: dict) -> str:
    return files["summary.md"].decode()


@pytest.mark.slow
def test_a_node_without_a_driver_is_one_cause_said_once_and_its_bug_report_comes_from_its_script(tmp_path, monkeypatch):
    node = socket.gethostname().split(".")[0]  # the evidence made on the node itself, where its script is
    reports = tmp_path / "reports"
    judged_run(
        reports, "r1", {node: readings(tmp_path / "nd.json", no_driver=True), "n2": readings(tmp_path / "ok.json")}
    )
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:/usr/bin:/bin")  # no nvidia-bug-report.sh on it yet

    out = tmp_path / "absent.tar.gz"
    done = gpufleet("evidence", node, "--reports-dir", str(reports), "--out", str(out), "--json")
    assert done.returncode == 0, done.stderr
    summary = summary_of(bundle_files(out))
    # One cause once: the missing driver with its 18 checks, not 18 lines; no `Driver None`.
    assert (
        summary.count("no NVIDIA driver") == 1 and "no NVIDIA driver: libnvidia-ml.so not found (18 checks: " in summary
    )
    assert "[software]" in summary and "gpu_health.processes:" not in summary, summary
    assert "None" not in summary and "Driver not read" in summary, summary
    assert "nvidia-bug-report.log: not included: nvidia-bug-report.sh is not on this node" in summary, summary

    # The node has the script: it runs, with a timeout, and its report (redacted) is in the bundle.
    (tmp_path / "bin").mkdir()
    script = tmp_path / "bin" / "nvidia-bug-report.sh"
    script.write_text(
        f'#!/bin/sh\necho "$@" > {tmp_path}/asked\n[ "$1" = --output-file ] || exit 2\n'
        'printf "nvidia-bug-report of %s\\nDB_PASS=bugpass-1\\n" "$(hostname)" | gzip > "$2.gz"\n'
    )
    script.chmod(0o755)
    out = tmp_path / "present.tar.gz"
    done = gpufleet("evidence", node, "--reports-dir", str(reports), "--out", str(out), "--bug-report-timeout-s", "30")
    assert done.returncode == 0, done.stderr
    files = bundle_files(out)
    bug = files["nvidia-bug-report.log.gz"].decode()
    assert bug.startswith("nvidia-bug-report of ") and "DB_PASS=[REDACTED]" in bug and "bugpass-1" not in bug
    assert (tmp_path / "asked").read_text().startswith("--output-file ")
    assert f"nvidia-bug-report.log: from {script} on this node" in summary_of(files)


@pytest.mark.slow
def test_already_tried_is_this_fault_s_ladder_and_the_gpu_s_figures_and_inforom_are_there(tmp_path):
    reports = tmp_path / "reports"
    bad = readings(tmp_path / "xid.json", xids=1, inforom="G520.0200.00.05")
    good = readings(tmp_path / "ok.json", inforom="G520.0200.00.05")
    # A fault re-tested and gone (its ladder cleared), then a new one re-tested: only the new one's step is this
    # fault's. No Slurm here: a re-test needs none.
    for run_id, n1 in (("r1", bad), ("r2", good), ("r3", bad)):
        run_dir = judged_run(reports, run_id, {"n1": n1, "n2": good})
        done = gpufleet("ladder", str(run_dir), "--act", "retest", "--json")
        steps = [s["step"] for s in json.loads(done.stdout)["steps"] if s["host"] == "n1"]
        assert steps == {"r1": ["retest"], "r2": ["clear"], "r3": ["retest"]}[run_id], done.stdout
    out = tmp_path / "gpu.tar.gz"
    done = gpufleet("evidence", "n1", "--gpu", SERIAL, "--reports-dir", str(reports), "--out", str(out))
    assert done.returncode == 0, done.stderr
    files = bundle_files(out)
    summary = summary_of(files)
    tried = next(line for line in summary.splitlines() if line.startswith("- Already tried"))
    assert "retest in run r3" in tried and "r1" not in tried, tried
    assert "InfoROM G520.0200.00.05" in summary and "VBIOS 96.00.DA.00.0C" in summary, summary
    # The GPU's figures from the run documents: what the checks read of it, run by run.
    figures = files["figures.md"].decode()
    assert "## What the checks read of the GPU, run by run" in figures and "| reading | r1 | r2 | r3 |" in figures
    assert "| temperature.temperature_c | 35 | 35 | 35 |" in figures and "| power_limit.power_draw_w |" in figures
    readings_json = json.loads(files["figures.json"])["readings"]
    assert [p["run_id"] for p in readings_json["ecc.ecc_aggregate_uncorrected"]] == ["r1", "r2", "r3"]
    # The whole ladder, cleared steps too, stays in ladder.json for who wants the history.
    assert [s["step"] for s in json.loads(files["ladder.json"])] == ["retest", "clear", "retest"]
