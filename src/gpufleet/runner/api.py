"""The runner's Python API: run, accept, resume and locate (gpufleet fleet ... calls these)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import yaml

from gpufleet.base import paths
from gpufleet.base.errors import InputError
from gpufleet.fleet import slurm_action as fleet_slurm
from gpufleet.runner import record as rec
from gpufleet.runner import resume as resume_mod
from gpufleet.runner.core import invoke
from gpufleet.runner.ending import ending_text, not_accepted_why, report_finals
from gpufleet.runner.invocation import (
    ACCEPTED,
    EXIT_ACCEPTED,
    EXIT_COULD_NOT_RUN,
    EXIT_INTERRUPTED,
    EXIT_NOT_ACCEPTED,
    Invocation,
    Outcome,
    check_user_vars,
)
from gpufleet.runner.events import FleetState
from gpufleet.runner.locating import Progress
from gpufleet.base.runs import new_run_id
from gpufleet.runner.project import Project, find_project, nodes_of, read_inventory
from gpufleet.runner.live_view import make_view

LOCATE_METHODS = ("auto", "pairs", "bisect")


def parse_extra_vars(items: list[str] | None) -> dict:
    """-e values as ansible-playbook takes them: JSON or YAML mappings, @file (vault-encrypted too), or key=value
    words."""
    out: dict = {}
    for item in items or []:
        text = item.strip()
        if text.startswith("@"):
            path = Path(text[1:])
            text, why = paths.read_text(path, follow=True)  # never waits on a FIFO
            if text is None:
                raise InputError(f"-e {item}: {path} {why}; expected a YAML or JSON file of variables")
        if text.startswith("{") or item.startswith("@"):
            try:
                val = _vault_file(path, item) if item.startswith("@") and VAULT_MARK in text else yaml.safe_load(text)
            except yaml.YAMLError as exc:
                raise InputError(f"-e {item!r} does not parse as JSON or YAML: {exc}") from None
            if not isinstance(val, dict):
                raise InputError(f"-e {item!r}: expected a mapping of variable -> value")
            out.update(val)
            continue
        for word in shlex.split(text):
            if "=" not in word:
                raise InputError(f"-e {item!r}: expected key=value words, a JSON object or @file")
            key, value = word.split("=", 1)
            out[key] = value
    return out


VAULT_MARK = "$ANSIBLE_VAULT;"  # a vault-encrypted file starts with it; a !vault value holds it


def _vault_file(path: Path, item: str) -> object:
    """A file of variables with vault content (encrypted whole, or !vault values), read as ansible-playbook reads
    -e @FILE: by Ansible's own loader, with the vault passwords its configuration gives (ANSIBLE_VAULT_PASSWORD_FILE,
    ANSIBLE_VAULT_IDENTITY_LIST, or ansible.cfg's vault_password_file and vault_identity_list). Decrypted in memory;
    its values then go the way of every -e value (private.write_private_vars)."""
    try:  # the controller extra's ansible-core; only needed here
        from ansible import constants
        from ansible.cli import CLI
        from ansible.errors import AnsibleError
        from ansible.parsing.ajson import AnsibleJSONEncoder
        from ansible.parsing.dataloader import DataLoader
    except ImportError:
        raise InputError(
            f"-e {item}: {path} holds vault-encrypted content, and ansible-core, which decrypts it, is not installed "
            "beside this Python: install the controller extra (pip install 'gpufleet[controller]')"
        ) from None
    loader = DataLoader()
    try:
        ids = list(constants.DEFAULT_VAULT_IDENTITY_LIST)
        loader.set_vault_secrets(CLI.setup_vault_secrets(loader, vault_ids=ids, auto_prompt=False))
        data = loader.load_from_file(str(path))
    except AnsibleError as exc:
        why = (getattr(exc, "message", "") or str(exc)).splitlines()[0].rstrip(".")
        raise InputError(
            f"-e {item}: {path} is vault-encrypted and could not be decrypted ({why}); give its password as "
            "ansible-playbook takes it: ANSIBLE_VAULT_PASSWORD_FILE, or vault_password_file in ansible.cfg"
        ) from None
    # Ansible's own types (tagged strings, vaulted values) as plain JSON values, the vaulted ones decrypted.
    return json.loads(json.dumps(data, cls=AnsibleJSONEncoder, vault_to_text=True))


def _reports_dir(reports_dir: str | Path | None) -> Path:
    return Path(reports_dir or paths.DEFAULT_REPORTS_DIR).resolve()


def _tier_vars(tier: str | None, soak_duration_s: int | None) -> dict:
    """--tier as gpufleet_tier, as given: the playbook's run_inputs checks it, once, before any node."""
    out = {"gpufleet_tier": tier} if tier else {}
    if soak_duration_s is not None:
        if soak_duration_s <= 0:
            raise InputError(f"--soak-duration-s {soak_duration_s}; expected a positive number of seconds")
        out["gpufleet_soak_duration_s"] = int(soak_duration_s)
    return out


def _slurm_vars(action: str | None, max_drain: str | None, take_over: bool) -> dict:
    """--slurm [drain|drain_resume] and --slurm-max-drain as the playbook's variables; accept also takes the nodes
    over in Slurm before testing them (gpufleet_slurm_take_over)."""
    if action is None:
        if max_drain is not None:
            raise InputError("--slurm-max-drain needs --slurm")
        return {}
    out = {"gpufleet_slurm_action": fleet_slurm.parse_action(action)}
    if max_drain is not None:
        fleet_slurm.parse_max_drain(max_drain)
        out["gpufleet_slurm_max_drain"] = max_drain
    if take_over:
        out["gpufleet_slurm_take_over"] = True
    return out


def _certify_vars(key: str | None, command: str | None, pubkey: str | None) -> dict:
    """--certify-key, or --certify-command with --certify-pubkey, as the playbook's variables, the files' paths made
    absolute (the playbook runs in another folder); validate.yml refuses a key open to others before any node."""
    if key and command:
        raise InputError("give --certify-key or --certify-command, not both")
    if command and not pubkey:
        raise InputError("--certify-command needs --certify-pubkey: the public key (PEM) of the key it signs with")
    out = {"gpufleet_certify_key": str(Path(key).resolve())} if key else {}
    if command:
        out.update(gpufleet_certify_command=command, gpufleet_certify_pubkey=str(Path(pubkey).resolve()))
    return out


def fleet_run(
    inventory: str,
    *,
    limit: str | None = None,
    tier: str | None = None,
    soak_duration_s: int | None = None,
    run_id: str | None = None,
    reports_dir: str | Path | None = None,
    extra_vars: dict | None = None,
    project: Project | str | None = None,
    view=None,
    envvars: dict | None = None,
    peers: list[str] | None = None,
    command: str = "run",
    slurm: str | None = None,
    slurm_max_drain: str | None = None,
    certify: dict | None = None,
) -> Outcome:
    """validate.yml over the inventory's gpu_nodes (narrowed by limit): one attempt of a new run. `slurm`: act on
    the verdict in Slurm (drain, drain_resume); `accept` also drains its nodes with a gpufleet reason first.
    `certify`: {key, command, pubkey}, the signing of each accepted node's certificate (_certify_vars)."""
    project = project if isinstance(project, Project) else find_project(project)
    user_vars = dict(extra_vars or {})
    check_user_vars(user_vars)
    user_vars.update(_tier_vars(tier, soak_duration_s))
    user_vars.update(_slurm_vars(slurm, slurm_max_drain, take_over=command == "accept"))
    user_vars.update(_certify_vars(**(certify or {"key": None, "command": None, "pubkey": None})))
    inv, hosts = nodes_of(project, inventory, limit)
    peers = list(peers or [])
    unknown = [p for p in peers if p not in inv.hosts]
    if unknown:
        raise InputError(f"--peers {', '.join(unknown)}: not in the group gpu_nodes of {inventory}")
    both = [p for p in peers if p in hosts]
    if both:
        raise InputError(
            f"--peers {', '.join(both)}: a peer joins the runs across nodes of nodes under test and cannot "
            "be one of them"
        )
    run_id = paths.run_id(run_id or new_run_id(), "--run-id")
    inv_obj = Invocation(
        command=command,
        playbook="validate",
        run_id=run_id,
        reports_dir=_reports_dir(reports_dir),
        inventory=inv.path,
        hosts=hosts,
        limit=hosts if limit or peers else None,
        peers=peers,
        user_vars=user_vars,
    )
    return invoke(project, inv_obj, view or make_view(), envvars=envvars)


def fleet_accept(nodes: list[str], *, peers: list[str] | None = None, inventory: str, **kw) -> Outcome:
    """The node-replacement run: validate.yml on the new nodes (--limit), the peers joining their runs across nodes."""
    if not nodes:
        raise InputError("accept needs the nodes to accept (NODE ...)")
    return fleet_run(inventory, limit=",".join(nodes), peers=peers, command="accept", **kw)


def fleet_resume(
    run_id: str,
    *,
    reports_dir: str | Path | None = None,
    inventory: str | None = None,
    extra_vars: dict | None = None,
    only_unfinished: bool = False,
    dry_run: bool = False,
    project: Project | str | None = None,
    view=None,
    envvars: dict | None = None,
) -> tuple[resume_mod.ResumePlan, Outcome | None]:
    """Run again what did not finish (and, unless only_unfinished, what failed or erred) in the same run."""
    project = project if isinstance(project, Project) else find_project(project)
    run_dir = _reports_dir(reports_dir) / paths.run_id(run_id, "RUN_ID")
    folder = rec.load_run_folder(run_dir)
    record = folder.record or {}
    first = next((i for i in record.get("invocations", []) if i.get("command") != "locate"), None)
    inventory = inventory or record.get("inventory")
    if not inventory:
        raise InputError(
            f"run {run_id} was not started by gpufleet fleet (no {rec.runner_dir(run_dir) / rec.RECORD}): "
            "give its inventory with -i"
        )
    user_vars = dict((first or {}).get("extravars") or {})
    extra = dict(extra_vars or {})
    check_user_vars(extra)
    user_vars.update(extra)
    again = [name for name in (first or {}).get("extravars_withheld") or [] if name not in extra]
    if again and not dry_run:
        raise InputError(
            f"run {run_id} was started with -e {', '.join(again)}, whose values are not recorded (they may "
            f"hold a secret): give {'it' if len(again) == 1 else 'them'} again with -e"
        )
    inv = read_inventory(project, inventory)
    peers = [p for p in (first or {}).get("peers") or [] if p in inv.hosts]
    plan = resume_mod.plan(
        folder, only_unfinished=only_unfinished, hostvars=inv.hostvars, extravars=user_vars, peers=peers
    )
    view = view or make_view()
    if dry_run or not plan.steps:
        view.message(plan.text())
        if dry_run:
            return plan, None
        outcome = _whole_run_outcome(run_dir, plan.hosts, "nothing to run again")
        view.message(ending_text(outcome.why, outcome.message))
        return plan, outcome
    view.message(plan.text())
    outcome = None
    for step in plan.steps:
        step_inv = Invocation(
            command="resume",
            playbook="validate",
            run_id=run_id,
            reports_dir=run_dir.parent,
            inventory=inv.path,
            hosts=step.limit,
            limit=step.limit,
            peers=step.peers,
            stages=step.stages,
            resume=True,
            user_vars=user_vars,
        )
        outcome = invoke(project, step_inv, view, envvars=envvars)
        if outcome.exit in (EXIT_INTERRUPTED, EXIT_COULD_NOT_RUN):
            return plan, outcome
    whole = _whole_run_outcome(run_dir, plan.hosts, "resumed")
    view.message(ending_text(whole.why, whole.message))
    return plan, whole


def _whole_run_outcome(run_dir: Path, hosts: list[str], what: str) -> Outcome:
    """Every node of the run judged by its report.json (written by the last attempt)."""
    report, finals = report_finals(run_dir, hosts, since=0)
    if report is None:
        return Outcome(
            EXIT_COULD_NOT_RUN,
            "no report",
            None,
            False,
            {},
            None,
            [],
            f"run {run_dir.name}: {what}, but it has no report.json to judge it by",
        )
    bad = [h for h, f in finals.items() if f != ACCEPTED]
    code = EXIT_NOT_ACCEPTED if bad else EXIT_ACCEPTED
    msg = (
        f"run {run_dir.name}: {what}; "
        + (
            f"{len(bad)} of {len(hosts)} node(s) not accepted: {', '.join(bad)}"
            if bad
            else f"all {len(hosts)} node(s) accepted"
        )
        + f"; report: {run_dir / 'report.md'}"
    )
    return Outcome(code, "successful", 0, False, finals, report, [], msg, not_accepted_why(report, finals))


# ---------------------------------------------------------------- locate


def judge_locate(inv: Invocation, started: float, status: str, rc, fleet: FleetState) -> tuple[int, dict, str]:
    """0 when nothing is slow, 1 when a node or link is named (or slow groups stay unexplained), 2 without locate.json."""
    path = inv.run_dir / "locate.json"
    doc, why = rec.read_json(path)
    if doc is None or path.stat().st_mtime < started - 1 or not doc.get("done"):
        failed = [f for f in fleet.failures if f.msg]
        detail = (
            "; ".join(f"{f.task}: {' '.join(f.msg.split())}" for f in failed[:3])
            or f"ansible-playbook ended {status} (rc {rc})"
        )
        return (
            EXIT_COULD_NOT_RUN,
            {h: "no localisation" for h in inv.hosts},
            (f"run {inv.run_id}: the localisation did not finish ({why or 'locate.json not written'}): {detail}"),
        )
    finals = {h: "good" if h in doc.get("known_good", []) else "not judged" for h in inv.hosts}
    for f in doc.get("findings") or []:
        if f.get("kind") == "node":
            finals[f["node"]] = "slow node" if f.get("why") != "failed" else "failed to run NCCL"
        elif f.get("kind") == "link":
            for h in f["pair"]:
                finals[h] = "slow link: " + " - ".join(f["pair"])
        elif f.get("kind") == "group":
            for h in f.get("members") or []:
                finals.setdefault(h, "slow together")
                if finals[h] in ("good", "not judged"):
                    finals[h] = "slow together"
    rounds = len(doc.get("rounds") or [])
    code = EXIT_ACCEPTED if doc.get("verdict") == "none" else EXIT_NOT_ACCEPTED
    return (
        code,
        finals,
        f"run {inv.run_id}: locate ({doc.get('method')}, {rounds} round(s)): {doc.get('summary')}; see {path}",
    )


def fleet_locate(
    inventory: str,
    *,
    limit: str | None = None,
    run_id: str | None = None,
    reports_dir: str | Path | None = None,
    method: str = "auto",
    ratio: float | None = None,
    pair_rounds: int | None = None,
    max_rounds: int | None = None,
    reference_gbps: float | None = None,
    base_port: int | None = None,
    extra_vars: dict | None = None,
    project: Project | str | None = None,
    view=None,
    envvars: dict | None = None,
) -> Outcome:
    """locate.yml over the inventory's gpu_nodes: NCCL over pairs or halves, round after round (fleet/locate.py)."""
    project = project if isinstance(project, Project) else find_project(project)
    if method not in LOCATE_METHODS:
        raise InputError(f"--method {method!r}; expected one of {', '.join(LOCATE_METHODS)}")
    user_vars = dict(extra_vars or {})
    check_user_vars(user_vars)
    inv, hosts = nodes_of(project, inventory, limit)
    if len(hosts) < 2:
        raise InputError(f"locate needs two nodes or more; --limit {limit} leaves {', '.join(hosts) or 'none'}")
    options = {
        "gpufleet_locate_method": method,
        "gpufleet_locate_ratio": ratio,
        "gpufleet_locate_pair_rounds": pair_rounds,
        "gpufleet_locate_max_rounds": max_rounds,
        "gpufleet_locate_reference_gbps": reference_gbps,
        "gpufleet_locate_base_port": base_port,
    }
    run_id = paths.run_id(run_id or new_run_id(), "--run-id")
    reports = _reports_dir(reports_dir)
    run_dir = reports / run_id
    # Locating inside an existing run (the one that was slow) adds an attempt to it.
    used = (run_dir / "run.json").exists() or (run_dir / "hosts").exists()
    inv_obj = Invocation(
        command="locate",
        playbook="locate",
        run_id=run_id,
        reports_dir=reports,
        inventory=inv.path,
        hosts=hosts,
        limit=hosts if limit else None,
        resume=used,
        user_vars=user_vars,
        extra_vars={k: v for k, v in options.items() if v is not None},
    )
    return invoke(
        project, inv_obj, view or make_view(), envvars=envvars, judge=judge_locate, describe=Progress(run_dir)
    )


def outcome_json(outcome: Outcome) -> str:
    """The run's ending for --json: one exit field, `exit`, the command's own (ansible-playbook's return code is
    ansible-runner's, in the run folder's runner/ artifacts and runner.json)."""
    return json.dumps(
        {
            "exit": outcome.exit,
            "status": outcome.status,
            "interrupted": outcome.interrupted,
            "nodes": outcome.finals,
            "message": outcome.message,
            "why": outcome.why,
        },
        sort_keys=True,
    )
