"""`gpufleet fleet ...`: the controller commands of the fleet runner.

    gpufleet fleet run -i INV [--limit L] [--tier T] [--run-id ID] [--reports-dir D] [-e VARS]...
    gpufleet fleet accept NODE... [--peers P...] -i INV [...]
    gpufleet fleet resume RUN_ID [--reports-dir D] [-i INV] [--only-unfinished] [--dry-run]
    gpufleet fleet locate -i INV [--limit L] [--method auto|pairs|bisect] [--ratio R] [--pair-rounds N] [...]
    gpufleet fleet locate-step RUN_DIR [--start --node N ...]   (locate.yml's controller module runs it)

Exit codes (errors.EXIT_CODES): 0 every node accepted (locate: nothing slow), 1 some node not accepted (locate: a slow node or link
named), 2 could not run (bad input, a playbook error before any node, ansible-runner failing), 130 interrupted.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from gpufleet.base import registry
from gpufleet.base.command_line import json_arg
from gpufleet.base.errors import InputError
from gpufleet.base.paths import DEFAULT_REPORTS_DIR
from gpufleet.fleet.slurm_action import DEFAULT_MAX_DRAIN
from gpufleet.runner import api, locating
from gpufleet.runner.api import outcome_json
from gpufleet.runner.live_view import make_view


def _common(p: argparse.ArgumentParser, *, inventory_required: bool = True) -> None:
    p.add_argument("-i", "--inventory", required=inventory_required, help="the site's inventory (file or folder)")
    p.add_argument("--reports-dir", default=DEFAULT_REPORTS_DIR, help="where run folders go (default: ./%(default)s)")
    p.add_argument(
        "-e",
        "--extra-vars",
        action="append",
        metavar="VARS",
        help="variables for the playbook as ansible-playbook takes them: key=value, JSON, or @file, vault-encrypted "
        "too (its password from ANSIBLE_VAULT_PASSWORD_FILE or ansible.cfg) (repeatable)",
    )
    p.add_argument(
        "--project",
        help="a gpufleet checkout whose playbooks to run (default: this folder's, the engine's "
        "checkout, or the installed collection gpufleet.cluster)",
    )
    p.add_argument("--plain", action="store_true", help="plain timestamped lines instead of the live table")
    p.add_argument(
        "--json",
        action="store_true",
        help="print one JSON line on stdout at the end: exit code, status, verdict "
        "per node, and why (each node not accepted: its failing checks with their reasons); the view goes to stderr",
    )


def _run_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--tier",
        choices=registry.run_tier_names(),
        help=f"how deep to test, gpufleet_tier (default: {registry.DEFAULT_RUN_TIER}): the engine decides from it what "
        "each node runs",
    )
    p.add_argument("--soak-duration-s", type=int, help="the soak tier's duration in seconds")
    p.add_argument("--run-id", help="the run's name (default: the UTC time); a used one is refused")
    p.add_argument(
        "--slurm",
        nargs="?",
        const="drain_resume",
        choices=["drain", "drain_resume"],
        help="after the report, drain the nodes not accepted and (drain_resume, the default) resume those "
        "gpufleet drained that pass (gpufleet_slurm_action); accept also drains its nodes with a gpufleet "
        "reason before testing them, so an accepted one is resumed",
    )
    p.add_argument(
        "--certify-key",
        metavar="KEY",
        help="sign a certificate for each accepted node after the report with this private key (gpufleet_certify_key; "
        "`gpufleet keygen`): mode 0600, outside the reports folder",
    )
    p.add_argument(
        "--certify-command",
        metavar="CMD",
        help="instead of --certify-key, the site's signing command (gpufleet_certify_command), with --certify-pubkey",
    )
    p.add_argument("--certify-pubkey", metavar="PUB", help="the public key the signing command signs for")
    p.add_argument(
        "--slurm-max-drain",
        metavar="N|N%",
        help="the breaker: at most N nodes or N%% of a partition "
        f"drained by the run (gpufleet_slurm_max_drain; default {DEFAULT_MAX_DRAIN.replace('%', '%%')})",
    )


def _view(args):
    # --json: stdout holds the JSON alone; the view (live or plain lines) goes to stderr.
    return make_view(plain=True if args.plain else None, stream=sys.stderr if args.json else None)


def _finish(args, outcome) -> int:
    if args.json:
        print(outcome_json(outcome))
    return outcome.exit


def _run_arguments(args) -> dict:
    """What `fleet run` and `fleet accept` hand the runner alike: their options of _common and _run_options."""
    return {
        "tier": args.tier,
        "soak_duration_s": args.soak_duration_s,
        "run_id": args.run_id,
        "reports_dir": args.reports_dir,
        "extra_vars": api.parse_extra_vars(args.extra_vars),
        "project": args.project,
        "view": _view(args),
        "slurm": args.slurm,
        "slurm_max_drain": args.slurm_max_drain,
        "certify": {"key": args.certify_key, "command": args.certify_command, "pubkey": args.certify_pubkey},
    }


def cmd_run(args) -> int:
    return _finish(args, api.fleet_run(args.inventory, limit=args.limit, **_run_arguments(args)))


def cmd_accept(args) -> int:
    out = api.fleet_accept(args.nodes, peers=args.peers or [], inventory=args.inventory, **_run_arguments(args))
    return _finish(args, out)


def cmd_resume(args) -> int:
    plan, out = api.fleet_resume(
        args.run_id,
        reports_dir=args.reports_dir,
        inventory=args.inventory,
        extra_vars=api.parse_extra_vars(args.extra_vars),
        only_unfinished=args.only_unfinished,
        dry_run=args.dry_run,
        project=args.project,
        view=_view(args),
    )
    if out is None:  # --dry-run
        if args.json:
            print(
                json.dumps(
                    {"reasons": plan.reasons, "steps": [vars(s) for s in plan.steps], "finished": plan.finished},
                    sort_keys=True,
                )
            )
        return 0
    return _finish(args, out)


def cmd_locate(args) -> int:
    out = api.fleet_locate(
        args.inventory,
        limit=args.limit,
        run_id=args.run_id,
        reports_dir=args.reports_dir,
        method=args.method,
        ratio=args.ratio,
        pair_rounds=args.pair_rounds,
        max_rounds=args.max_rounds,
        reference_gbps=args.reference_gbps,
        base_port=args.base_port,
        extra_vars=api.parse_extra_vars(args.extra_vars),
        project=args.project,
        view=_view(args),
    )
    return _finish(args, out)


def cmd_locate_step(args) -> int:
    thresholds = json_arg(args.thresholds, "--thresholds (gpufleet_thresholds)")
    left_out = json.loads(args.left_out) if args.left_out else {}
    if not isinstance(left_out, dict):
        raise InputError("--left-out must be a JSON object of node -> why it takes no part")
    state = locating.step(
        Path(args.run_dir),
        start=args.start,
        nodes=args.node,
        left_out=left_out,
        method=args.method,
        ratio=args.ratio,
        thresholds=thresholds,
        pair_rounds=args.pair_rounds,
        max_rounds=args.max_rounds,
        reference_gbps=args.reference_gbps,
        base_port=args.base_port,
    )
    print(json.dumps(locating.step_summary(state, Path(args.run_dir)), sort_keys=True))
    return 0


def _locate_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--method",
        default="auto",
        choices=["auto", "pairs", "bisect"],
        help="pairs: every node paired per round; bisect: halves followed to the slow one; auto: bisect from 32 nodes",
    )
    p.add_argument(
        "--ratio",
        type=float,
        help="a group under this fraction of the round's reference is slow "
        "(default: locate_busbw_ratio_min of files/profiles/generic.yml, 0.8)",
    )
    p.add_argument("--pair-rounds", type=int, help="rounds of new pairs while nothing is found (pairs; default 1)")
    p.add_argument("--max-rounds", type=int, help="stop after this many rounds (default: from the node count)")
    p.add_argument("--reference-gbps", type=float, help="judge against this busbw instead of the rounds' own")
    p.add_argument(
        "--base-port", type=int, help="rendezvous port of a round's first group; the next groups take the next ports"
    )


def add_parsers(sub) -> None:
    fleet = sub.add_parser("fleet", help="run the playbooks with a live view, resume a run, locate a slow node")
    fsub = fleet.add_subparsers(dest="fleet_command", required=True, metavar="COMMAND")

    r = fsub.add_parser("run", help="validate.yml over the inventory's gpu_nodes, with a live view")
    _common(r)
    _run_options(r)
    r.add_argument("--limit", help="the nodes to run on (ansible's --limit)")
    r.set_defaults(func=cmd_run)

    a = fsub.add_parser(
        "accept", help="accept replaced nodes: validate.yml on them, known-good peers joining NCCL across nodes"
    )
    a.add_argument("nodes", nargs="+", metavar="NODE", help="the new nodes (inventory names)")
    a.add_argument("--peers", nargs="+", metavar="PEER", help="known-good nodes that join the runs across nodes")
    _common(a)
    _run_options(a)
    a.set_defaults(func=cmd_accept)

    s = fsub.add_parser("resume", help="run again the nodes and stages of a run that failed, erred or did not finish")
    s.add_argument("run_id", metavar="RUN_ID")
    _common(s, inventory_required=False)
    s.add_argument(
        "--only-unfinished",
        action="store_true",
        help="only what did not finish (unreachable, interrupted, a module that could not run), not what failed",
    )
    s.add_argument("--dry-run", action="store_true", help="say what would run again, run nothing")
    s.set_defaults(func=cmd_resume)

    loc = fsub.add_parser(
        "locate", help="find the slow node or link: NCCL over pairs or halves of the nodes, round after round"
    )
    _common(loc)
    loc.add_argument("--limit", help="the nodes to look at (ansible's --limit)")
    loc.add_argument("--run-id", help="the run's name; an existing run's id adds the localisation to it")
    _locate_options(loc)
    loc.set_defaults(func=cmd_locate)

    # locate.yml's own step (its controller module runs it): no help, so `gpufleet fleet --help` leaves it out.
    st = fsub.add_parser(
        "locate-step", description="(locate.yml) start a localisation, or judge the round just run and plan the next"
    )
    st.add_argument("run_dir", metavar="RUN_DIR")
    st.add_argument("--start", action="store_true", help="a new localisation over the --node's")
    st.add_argument(
        "--node", action="append", help="a node to locate among, in inventory order (repeatable; with --start)"
    )
    st.add_argument("--thresholds", help="JSON of gpufleet_thresholds (locate_busbw_ratio_min is read)")
    st.add_argument(
        "--left-out", help="JSON object: the nodes of the run that take no part, each with why (with --start)"
    )
    _locate_options(st)
    st.set_defaults(func=cmd_locate_step)
