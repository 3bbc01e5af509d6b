"""The acceptance certificates (docs/certificates.md): a run reported by the engine's own commands from recorded H200
readings, certified and verified by `gpufleet keygen | certify | verify` as the docs give them, and the tamper matrix:
every byte region of the payload and of the signature changed, valid_until moved, the clock past expiry, a GPU's
serial swapped, a GPU missing, the board changed, a wrong key, a truncated envelope: each refused with its reason; the
untouched certificate valid to gpufleet and to securesystemslib's own DSSE verifier, its Statement parsed by in-toto's
attestation library."""

from __future__ import annotations

import base64
import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpufleet.base import certificates
from gpufleet.certify import signing, statement, verify

REPO = Path(__file__).resolve().parents[1]
READINGS = REPO / "tests" / "data" / "readings" / "recorded-h200-x2-vm.json"
# What the recording (made before gpufleet read them) lacks, turned off as a site would (gpufleet_checks_disabled).
OFF = '["gpu_health.processes", "host_hygiene.pcie_aer", "host_hygiene.bringup_drift"]'
pytestmark = pytest.mark.slow  # each command a process of its own: a second each

BOARD = {
    "path": "/sys/class/dmi/id",
    "board_serial": "BSN-4411",
    "chassis_serial": "CSN-09",
    "product_serial": "PSN-77",
    "product_uuid": "4c4c4544-0042-3510-8052-b2c04f4e3433",
    "board_vendor": "Supermicro",
    "board_name": "X13DEG-OAD",
    "sys_vendor": "Supermicro",
    "product_name": "SYS-821GE-TNHR",
    "unreadable": {},
}


def gpufleet(*args, env=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "gpufleet", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, GPUFLEET_CHECKS_DISABLED=OFF, **(env or {})),
    )


def reported_run(tmp: Path, hosts: dict[str, str], run_id: str = "r1") -> Path:
    """A reported run of `hosts` ({host: gpufleet_thresholds JSON}): each node's document from `gpufleet check
    --readings` of the recording with a board, then `gpufleet report`."""
    readings = json.loads(READINGS.read_text())
    readings["host"]["dmi"] = {  # as collect.host.dmi reads it
        "path": BOARD["path"],
        "present": True,
        "source": "sysfs",
        "fields": {k: v for k, v in BOARD.items() if k not in ("path", "unreadable")},
        "not_read": {},
        "reason": None,
    }
    recording = tmp / "readings.json"
    recording.write_text(json.dumps(readings))
    reports = tmp / "reports"
    hosts_args = [a for h in hosts for a in ("--host", h)]
    assert gpufleet("run", "start", reports, run_id, "--tier", "acceptance", *hosts_args).returncode == 0
    run = reports / run_id
    for host, thresholds in hosts.items():
        done = gpufleet("check", "--readings", recording, "--host", host, "--thresholds", thresholds, "--json")
        (run / "hosts" / f"{host}.json").write_text(done.stdout)
    gpufleet("report", run, "--no-store")
    return run


@pytest.fixture(scope="module")
def signed(tmp_path_factory):
    """node0 accepted, node1 not (it expects 3 GPUs); the key outside the reports folder."""
    tmp = tmp_path_factory.mktemp("certificates")
    run = reported_run(tmp, {"node0": '{"gpus_expected": 2}', "node1": '{"gpus_expected": 3}'})
    key = tmp / "keys" / "site.key"
    made = gpufleet("keygen", key, "--json")
    assert made.returncode == 0, made.stderr
    done = gpufleet("certify", run, "--key", key, "--json")
    return {"tmp": tmp, "run": run, "key": key, "pub": Path(f"{key}.pub"), "certify": done}


def node_cert(signed) -> Path:
    return certificates.node_path(signed["run"], "node0")


def check(signed, cert, *more) -> dict:
    done = gpufleet("verify", cert, "--pubkey", signed["pub"], "--json", *more)
    out = json.loads(done.stdout)
    assert out["exit"] == done.returncode, done
    return out


def test_certify_signs_the_accepted_node_and_says_why_not_the_other(signed):
    done = signed["certify"]
    assert done.returncode == 1, done.stderr  # a node got no certificate
    record = json.loads(done.stdout)
    assert list(record["certified"]) == ["node0"] and record["certified"]["node0"]["gpus"] == 2
    assert "not accepted (verdict fail: gpu_inventory.gpu_count failed)" in record["not_certified"]["node1"]
    assert not certificates.node_path(signed["run"], "node1").exists()
    assert (signed["run"] / "certificates" / "fleet.intoto.json").is_file()
    assert oct(signed["key"].stat().st_mode & 0o777) == "0o600"


def test_the_untouched_certificate_is_valid_to_gpufleet_and_to_the_libraries(signed):
    out = check(signed, node_cert(signed), "--document", signed["run"] / "hosts" / "node0.json")
    assert out["valid"] and out["exit"] == 0 and out["node"] == "node0", out
    assert check(signed, node_cert(signed), "--report", signed["run"] / "report.json")["valid"]
    assert check(signed, signed["run"] / "certificates" / "fleet.intoto.json")["valid"]
    # A buyer without gpufleet: securesystemslib's own DSSE verifier and the public key, then in-toto's Statement.
    from cryptography.hazmat.primitives.serialization import load_pem_public_key
    from google.protobuf import json_format
    from in_toto_attestation.v1 import statement as in_toto_statement, statement_pb2
    from securesystemslib.dsse import Envelope
    from securesystemslib.signer import SSlibKey

    key = SSlibKey.from_crypto(load_pem_public_key(signed["pub"].read_bytes()))
    envelope = Envelope.from_dict(json.loads(node_cert(signed).read_text()))
    assert list(envelope.verify([key], 1)) == [key.keyid]
    parsed = json_format.Parse(envelope.payload, statement_pb2.Statement())
    in_toto_statement.Statement.copy_from_pb(parsed).validate()
    predicate = json.loads(envelope.payload)["predicate"]
    serials = {
        s["annotations"]["serial"] for s in json.loads(envelope.payload)["subject"] if s["name"].startswith("gpu:")
    }
    assert serials == {"1653724058331", "1653724049352"}
    assert predicate["validity"]["days"] == 21 and "Cluster Readiness Engine" in predicate["validity"]["source"]
    assert predicate["report"]["sha256"] == statement.sha256((signed["run"] / "report.json").read_bytes())
    assert {f["check"] for f in predicate["figures"]} >= {"gpu_inventory.gpu_count", "gpu_inventory.gpu_memory"}


def envelope_of(signed) -> dict:
    return json.loads(node_cert(signed).read_text())


def write_variant(signed, name: str, envelope: dict | str) -> Path:
    path = signed["tmp"] / "variants" / f"{name}.intoto.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text(envelope if isinstance(envelope, str) else json.dumps(envelope))
    return path


def flipped(data: bytes, at: int) -> bytes:
    return data[:at] + bytes([data[at] ^ 0x01]) + data[at + 1 :]


def payload_regions(payload: bytes) -> dict[str, int]:
    text = payload.decode()
    return {
        "first byte": 0,
        "statement type": text.index("in-toto.io"),
        "predicate type": text.index("gpufleet.dev"),
        "a GPU serial": text.index("1653724058331"),
        "the board serial": text.index("BSN-4411"),
        "the verdict": text.index('"verdict"') + 11,
        "a figure": text.index('"figures"') + 40,
        "valid_until": text.index('"valid_until"') + 16,
        "report digest": text.index('"report"') + 30,
        "middle": len(payload) // 2,
        "last byte": len(payload) - 1,
    }


def test_every_region_of_the_payload_and_of_the_signature_changed_is_refused(signed):
    """In this process, the function `gpufleet verify` runs (the command itself refuses them alike: the tests below)."""
    key = signing.public_key(signed["pub"])
    env = envelope_of(signed)
    payload = base64.b64decode(env["payload"])
    regions = payload_regions(payload)
    sig = base64.b64decode(env["signatures"][0]["sig"])
    for where in (0, 1, 31, 32, 33, len(sig) // 2, len(sig) - 1):
        regions[f"signature byte {where}"] = -1 - where
    refused = {}
    for name, at in regions.items():
        changed = copy.deepcopy(env)
        if at >= 0:
            changed["payload"] = base64.b64encode(flipped(payload, at)).decode()
        else:
            changed["signatures"][0]["sig"] = base64.b64encode(flipped(sig, -1 - at)).decode()
        out = verify.verify(write_variant(signed, "region", changed), key)
        refused[name] = (out["exit"], out["kind"])
        assert "does not verify" in out["reason"], (name, out)
    assert set(refused.values()) == {(1, "signature")}, refused
    assert len(refused) == 17


def test_valid_until_moved_is_refused(signed):
    env = envelope_of(signed)
    doc = json.loads(base64.b64decode(env["payload"]))
    doc["predicate"]["valid_until"] = "2099-01-01T00:00:00Z"
    env["payload"] = base64.b64encode(statement.canonical(doc)).decode()
    out = check(signed, write_variant(signed, "moved", env))
    assert (out["exit"], out["kind"]) == (1, "signature"), out


def test_the_clock_past_expiry_is_refused(signed):
    until = certificates.epoch(json.loads(base64.b64decode(envelope_of(signed)["payload"]))["predicate"]["valid_until"])
    before, after = certificates.utc(until - 1), certificates.utc(until + 1)
    assert check(signed, node_cert(signed), "--at", before)["valid"]
    out = check(signed, node_cert(signed), "--at", after)
    assert (out["exit"], out["kind"]) == (1, "expired") and "expired on" in out["reason"], out
    fleet = check(signed, signed["run"] / "certificates" / "fleet.intoto.json", "--at", after)
    assert (fleet["exit"], fleet["kind"]) == (1, "expired"), fleet


def test_a_certificate_past_its_validity_is_expired_on_the_real_clock(tmp_path):
    """The documented default (no --at): a node whose profile gives the tier 0 days is expired once certified."""
    run = reported_run(tmp_path, {"node0": '{"gpus_expected": 2, "certificate_valid_days_acceptance": 0}'})
    key = tmp_path / "site.key"
    assert gpufleet("keygen", key).returncode == 0
    assert gpufleet("certify", run, "--key", key).returncode == 0
    done = gpufleet("verify", certificates.node_path(run, "node0"), "--pubkey", f"{key}.pub")
    assert done.returncode == 1 and done.stdout.startswith("not valid: expired on"), done


def document_variant(signed, change) -> Path:
    doc = json.loads((signed["run"] / "hosts" / "node0.json").read_text())
    inventory = next(r for r in doc["results"] if r["check"] == "gpu_count")["detail"]["inventory"]
    change(inventory)
    path = signed["tmp"] / "variants" / "node0.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(doc))
    return path


def swap_serials(inventory):
    a, b = inventory["gpus"]
    a["serial"], b["serial"] = b["serial"], a["serial"]


def test_hardware_that_differs_from_the_certified_is_refused(signed):
    def drop(inventory):
        inventory["gpus"].pop(1)

    def board(inventory):
        inventory["board"]["board_serial"] = "BSN-9999"

    cases = {
        "swap": (swap_serials, "(swapped)"),
        "missing": (drop, "GPU GPU-755c8ad9-4858-d710-94b4-5641916ac523 (serial 1653724049352) is missing"),
        "board": (board, "the board changed: board_serial BSN-9999, certified BSN-4411"),
    }
    for name, (change, said) in cases.items():
        out = check(signed, node_cert(signed), "--document", document_variant(signed, change))
        assert (out["exit"], out["kind"]) == (1, "hardware") and said in out["reason"], (name, out)


def test_the_live_reading_is_compared_as_the_document_is(signed):
    """`--live` reads `gpufleet collect --identity`; its reading, a GPU serial swapped in it, differs the same way."""
    readings = json.loads(READINGS.read_text())
    live = {"board": BOARD, "nvml": {"available": True, "error": None}, "gpus": readings["nvml"]["gpus"]}
    subjects = json.loads(base64.b64decode(envelope_of(signed)["payload"]))["subject"]
    assert verify.compare(subjects, live) == ([], [])
    swapped = copy.deepcopy(live)
    swap_serials(swapped)
    differs, _ = verify.compare(subjects, swapped)
    assert len(differs) == 2 and all("(swapped)" in d for d in differs), differs
    unread = copy.deepcopy(live)
    unread["board"] = {"board_serial": None, "unreadable": {"board_serial": "only root may read it"}}
    assert verify.compare(subjects, unread)[1][0].startswith("the board's board_serial cannot be read now")


def test_live_on_a_machine_without_gpus_cannot_verify(signed):
    out = check(signed, node_cert(signed), "--live")
    assert (out["exit"], out["kind"]) == (2, "input"), out
    assert "cannot read this machine's GPUs: no NVIDIA driver" in out["reason"]


def test_a_wrong_key_and_a_truncated_envelope_are_refused(signed):
    other = signed["tmp"] / "other.key"
    assert gpufleet("keygen", other).returncode == 0
    done = gpufleet("verify", node_cert(signed), "--pubkey", f"{other}.pub", "--json")
    out = json.loads(done.stdout)
    assert (done.returncode, out["kind"]) == (1, "signature") and "no signature by key" in out["reason"], out
    text = node_cert(signed).read_text()
    for cut in (1, len(text) // 2, len(text) - 3):
        out = check(signed, write_variant(signed, "truncated", text[:cut]))
        assert (out["exit"], out["kind"]) == (1, "form") and "is no DSSE envelope" in out["reason"], (cut, out)


def test_a_fleet_certificate_refuses_a_changed_node_certificate_and_a_report_that_differs(signed):
    run = signed["run"]
    copy_dir = signed["tmp"] / "fleet-copy"
    (copy_dir / "nodes").mkdir(parents=True, exist_ok=True)
    (copy_dir / "fleet.intoto.json").write_text((run / "certificates" / "fleet.intoto.json").read_text())
    (copy_dir / "nodes" / "node0.intoto.json").write_text(node_cert(signed).read_text().replace('"', '"', 1) + " ")
    out = check(signed, copy_dir / "fleet.intoto.json")
    assert (out["exit"], out["kind"]) == (1, "digest") and "not the file certified" in out["reason"], out
    report = json.loads((run / "report.json").read_text())
    report["verdict"] = "pass "
    other = signed["tmp"] / "report.json"
    other.write_text(json.dumps(report))
    out = check(signed, node_cert(signed), "--report", other)
    assert (out["exit"], out["kind"]) == (1, "digest"), out


def test_bad_input_exits_2_naming_it(signed):
    for args, said in (
        (("verify", signed["tmp"] / "none.json", "--pubkey", signed["pub"]), "none.json cannot be read: No such file"),
        (("verify", node_cert(signed), "--pubkey", node_cert(signed)), "is not a public key in PEM"),
        (
            ("verify", signed["run"] / "certificates" / "fleet.intoto.json", "--pubkey", signed["pub"], "--live"),
            "not a fleet's",
        ),
    ):
        done = gpufleet(*args)
        assert done.returncode == 2 and said in done.stdout + done.stderr, (args, done)


def test_a_private_key_open_to_others_or_inside_the_reports_folder_is_refused(signed, tmp_path):
    key = tmp_path / "open.key"
    assert gpufleet("keygen", key).returncode == 0
    key.chmod(0o644)
    done = gpufleet("certify", signed["run"], "--key", key)
    assert done.returncode == 2 and "has mode 0644" in done.stderr and "chmod 600" in done.stderr, done.stderr
    inside = signed["run"].parent / "keys" / "site.key"
    done = gpufleet("keygen", inside, "--reports-dir", signed["run"].parent)
    assert done.returncode == 2 and "lies inside the reports folder" in done.stderr, done.stderr
    key.chmod(0o600)
    moved = signed["run"].parent / "site.key"
    moved.write_bytes(key.read_bytes())
    moved.chmod(0o600)
    done = gpufleet("certify", signed["run"], "--key", moved)
    assert done.returncode == 2 and "lies inside the reports folder" in done.stderr, done.stderr
    moved.unlink()
    done = gpufleet("keygen", signed["key"])
    assert done.returncode == 2 and "is never overwritten" in done.stderr


SIGNING_COMMAND = (
    "import sys; from cryptography.hazmat.primitives.serialization import load_pem_private_key as load; "
    "key = load(open(sys.argv[1], 'rb').read(), None); sys.stdout.buffer.write(key.sign(sys.stdin.buffer.read()))"
)


def test_a_sites_signing_command_signs_as_the_key_does(tmp_path):
    """An HSM's stand-in: a command that reads DSSE's bytes on stdin and writes the signature, raw."""
    run = reported_run(tmp_path, {"node0": '{"gpus_expected": 2}'})
    key, other = tmp_path / "hsm.key", tmp_path / "other.key"
    assert gpufleet("keygen", key).returncode == 0 and gpufleet("keygen", other).returncode == 0
    command = f'{sys.executable} -c "{SIGNING_COMMAND}" {key}'
    done = gpufleet("certify", run, "--sign-command", command, "--pubkey", f"{key}.pub")
    assert done.returncode == 0, done.stderr
    verified = gpufleet("verify", certificates.node_path(run, "node0"), "--pubkey", f"{key}.pub")
    assert verified.returncode == 0, verified
    done = gpufleet("certify", run, "--sign-command", command, "--pubkey", f"{other}.pub")
    assert done.returncode == 2 and "does not verify" in done.stderr, done.stderr


def test_no_private_key_material_in_the_run_folder(signed):
    pem = signed["key"].read_text()
    body = "".join(line for line in pem.splitlines() if "-----" not in line)
    for path in signed["run"].parent.rglob("*"):
        if path.is_file():
            text = path.read_bytes().decode("utf-8", "replace")
            assert "PRIVATE KEY" not in text and body not in text, path


def test_the_expiry_of_each_node_for_prometheus_and_the_index(signed):
    from prometheus_client.parser import text_string_to_metric_families

    prom = (signed["run"] / "certificates" / "expiry.prom").read_text()
    (family,) = text_string_to_metric_families(prom)
    (sample,) = family.samples
    claim = certificates.latest(signed["run"].parent)["node0"]
    assert sample.labels == {"node": "node0", "run_id": "r1", "tier": "acceptance"}
    assert sample.value == certificates.epoch(claim["valid_until"])
    assert certificates.scan(signed["run"].parent) == certificates.latest(signed["run"].parent)
    collector = signed["tmp"] / "textfile"
    collector.mkdir()
    assert gpufleet("certify", signed["run"], "--key", signed["key"], "--textfile-dir", collector).returncode == 1
    assert (collector / "gpufleet-certificates.prom").read_text() == prom
