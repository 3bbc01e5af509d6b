"""`gpufleet keygen | certify | verify`: the acceptance certificates (docs/certificates.md). Their parsers and how
each runs; main.py loads this module only for them.

    gpufleet keygen KEY                                      KEY (0600) and KEY.pub: the buyer needs KEY.pub
    gpufleet certify RUN_DIR --key KEY                       a certificate for each node the run accepted
    gpufleet certify RUN_DIR --sign-command CMD --pubkey PUB the same, signed by the site's command (HSM, KMS)
    gpufleet verify CERT --pubkey PUB [--document DOC | --live] [--report REPORT] [--at TIME]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from gpufleet.base import certificates, paths
from gpufleet.base.errors import InputError
from gpufleet.base.paths import DEFAULT_REPORTS_DIR
from gpufleet.certify import issue, signing, statement, verify


def _print(doc: dict, as_json: bool, text: str) -> None:
    print(json.dumps(doc, sort_keys=True) if as_json else text)


def cmd_keygen(args) -> int:
    made = signing.keygen(args.key, [args.reports_dir])
    text = f"private key {made['key']} (0600: keep it off every run folder)\n"
    text += f"public key  {made['pubkey']} (key id {made['keyid']}): give it to whoever verifies"
    _print(made, args.json, text)
    return 0


def cmd_certify(args) -> int:
    reports = [Path(args.run_dir).resolve().parent, Path(args.reports_dir)]
    signer = signing.signer_of(args.key, args.sign_command, args.pubkey, reports)
    record = issue.certify(Path(args.run_dir), signer, textfile_dir=args.textfile_dir, fleet_hosts=args.fleet_host)
    _print(record, args.json, issue.summary_text(record))
    return 1 if record["not_certified"] else 0


def cmd_verify(args) -> int:
    if args.document and args.live:
        raise InputError("give --document or --live, not both")
    key = signing.public_key(args.pubkey)
    at = None
    if args.at:
        at = certificates.epoch(args.at)
        if at is None:
            raise InputError(f"--at {args.at!r}; expected a UTC time as 2026-12-19T10:00:00Z")
    hardware, why = None, None
    envelope, _ = paths.read_json(args.certificate, follow=True)
    fleet = (certificates.statement_of(envelope) or {}).get("predicateType") == certificates.FLEET_PREDICATE_TYPE
    if fleet and (args.document or args.live):
        why = "--document and --live check one node's certificate, not a fleet's"
    elif args.document:
        doc, why = _read(args.document)
        hardware, why = statement.identity(doc) if doc is not None else (None, why)
        why = why and f"--document {args.document}: {why}"
    elif args.live:
        hardware, why = verify.live_identity(args.python)
    if why:
        result = verify.cannot_check(why, args.certificate)
    else:
        result = verify.verify(args.certificate, key, hardware=hardware, report=args.report, at=at)
    if result["exit"] == verify.BAD_INPUT:  # could not check: said on stderr, as every command's refusal is
        print(f"{args.command_name}: {verify.text(result)}", file=sys.stderr)
    if args.json or result["exit"] != verify.BAD_INPUT:
        _print(result, args.json, verify.text(result))
    return result["exit"]


def _read(path: str) -> tuple[dict | None, str | None]:
    doc, why = paths.read_json(path, follow=True)  # the operator's own file: a link followed, a FIFO not waited on
    if isinstance(doc, dict):
        return doc, None
    return None, f"it {why or 'is not a host document'}; give the certified node's host document, readable to this user"


def add_parsers(sub) -> None:
    k = sub.add_parser(
        "keygen", help="an Ed25519 key pair for the certificates: KEY (0600) and KEY.pub, which buyers need"
    )
    k.add_argument("key", metavar="KEY", help="the private key file to write (never inside a reports folder)")
    k.add_argument(
        "--reports-dir",
        default=DEFAULT_REPORTS_DIR,
        help="the reports folder KEY must stay out of (default ./%(default)s)",
    )
    k.add_argument("--json", action="store_true", help="print JSON")
    k.set_defaults(func=cmd_keygen)

    c = sub.add_parser(
        "certify", help="a signed certificate (in-toto, DSSE) for each node a reported run accepted, valid for its tier"
    )
    c.add_argument("run_dir", metavar="RUN_DIR", help="the reported run (its report.json and hosts/)")
    c.add_argument("--key", help="the private key file (gpufleet_certify_key): 0600, outside the reports folder")
    c.add_argument(
        "--sign-command",
        help="instead of --key, the site's signing command (gpufleet_certify_command): DSSE's bytes to sign on its "
        "stdin, GPUFLEET_KEYID in its environment, the signature (raw or base64) on its stdout",
    )
    c.add_argument("--pubkey", help="with --sign-command: the public key (PEM) it signs for (gpufleet_certify_pubkey)")
    c.add_argument(
        "--reports-dir", default=DEFAULT_REPORTS_DIR, help="a reports folder the key must stay out of, beside RUN_DIR's"
    )
    c.add_argument("--textfile-dir", help=f"also write {issue.TEXTFILE_NAME} there (node_exporter's textfile folder)")
    c.add_argument("--fleet-host", action="append", help="with --textfile-dir: only these nodes (the inventory's)")
    c.add_argument("--json", action="store_true", help="print what was certified as JSON")
    c.set_defaults(func=cmd_certify)

    v = sub.add_parser(
        "verify", help="whether a certificate holds (signature, form, time, hardware): exit 0 valid, 1 not, 2 bad input"
    )
    v.add_argument("certificate", metavar="CERT", help="a node's or a fleet's certificate (.intoto.json)")
    v.add_argument("--pubkey", required=True, help="the signer's public key (PEM, the KEY.pub of `gpufleet keygen`)")
    v.add_argument("--document", metavar="HOST_DOC", help="the hardware of this host document must be the certified")
    v.add_argument(
        "--live",
        action="store_true",
        help="this machine's hardware now must be the certified (read through NVML by `gpufleet collect --identity`)",
    )
    v.add_argument(
        "--python", help=f"with --live: the Python whose engine reads the hardware (default {sys.executable})"
    )
    v.add_argument("--report", help="the run's report.json, which must be the one certified")
    v.add_argument("--at", help="judge the time at this UTC moment (2026-12-19T10:00:00Z) instead of now")
    v.add_argument("--json", action="store_true", help="print the verdict as JSON")
    v.set_defaults(func=cmd_verify)
