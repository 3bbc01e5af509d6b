"""The playbooks' own steps around a run: `gpufleet run start | alive | locks-kept` on the controller, `gpufleet run
playbook` (how the fleet runner starts ansible-playbook) and `gpufleet lock` on a node (the lock that keeps two runs
from measuring it at once). Their parsers and how each runs; main.py loads this module only for them, so a node's
lock costs no more than the lock."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from pathlib import Path

from gpufleet.base import guard, lock, paths, runs, schema
from gpufleet.base.command_line import json_arg
from gpufleet.base.errors import InputError
from gpufleet.base.lock import DEFAULT_PATH as DEFAULT_LOCK_PATH


def cmd_run_start(args) -> int:
    started = runs.start(
        args.reports_dir,
        args.run_id,
        playbook=args.playbook,
        hosts=args.host or [],
        tier=args.tier,
        resume=args.resume,
        limit=args.limit,
        stages=args.stage,
        dry_run=args.dry_run,
    )
    print(json.dumps(started, sort_keys=True))
    return 0


def cmd_run_alive(args) -> int:
    try:
        controller = json.loads(args.controller)
    except json.JSONDecodeError as exc:
        raise InputError(f"--controller is not JSON ({exc.msg}); expected the controller record of a lock") from None
    print(json.dumps({"alive": runs.controller_alive(controller)}))
    return 0


def cmd_run_locks_kept(args) -> int:
    kept = json_arg(args.kept, "--kept")
    runs.record_locks_kept(Path(args.run_dir), kept)
    print(json.dumps({"locks_not_given_back": kept}, sort_keys=True))
    return 0


def cmd_run_playbook(args) -> int:
    """ansible-playbook in place of this process, as the fleet runner starts it (through ansible-runner): the kernel
    sends it SIGTERM when the runner dies, kill -9 included (PR_SET_PDEATHSIG), and ansible-playbook then stops its
    workers, whose actions stop what they started on the nodes; a runner already gone starts nothing. The extra
    variables (--vars, which may hold a secret) are removed as soon as ansible-playbook is gone, should the runner
    not be there to remove them (it does once the playbook has read them)."""
    guard.die_with_parent()
    if os.getppid() != args.runner:
        _remove_vars(args.vars)
        raise InputError(f"the fleet runner (pid {args.runner}) is gone: ansible-playbook is not started")
    if args.vars:
        _watch_vars(Path(args.vars), os.getpid())
    try:
        os.execv(args.command[0], args.command)
    except OSError as exc:
        _remove_vars(args.vars)
        raise InputError(f"{args.command[0]} cannot be run: {exc.strerror}; expected ansible-playbook") from None


def _remove_vars(path: str | None) -> None:
    if path:
        shutil.rmtree(Path(path).parent, ignore_errors=True)  # the runner's private folder, made for this file


def _watch_vars(path: Path, playbook_pid: int) -> None:
    """A process of its own (forked twice, so nothing waits on it) that removes `path`'s folder when the process
    `playbook_pid` is gone before the folder is; it ends once the folder is gone, whoever removed it."""
    if os.fork():
        os.wait()
        return
    try:
        if os.fork() == 0:
            quiet = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):  # not the playbook's terminal: its end is read when the playbook's last holder goes
                os.dup2(quiet, fd)
            while path.parent.exists():
                try:
                    os.kill(playbook_pid, 0)
                except ProcessLookupError:
                    _remove_vars(str(path))
                time.sleep(0.2)
    finally:
        os._exit(0)


def cmd_lock(args) -> int:
    if args.lock_command != "show":
        paths.safe_name(args.run_id, "--run-id")
        paths.safe_name(args.holder, "--holder")
    if args.lock_command == "acquire":
        controller = json_arg(args.controller, "--controller")
        asked = schema.utc_now()
        out = lock.acquire(
            args.path,
            args.run_id,
            args.holder,
            args.ttl_s,
            controller=controller,
            dead_runs=args.dead_run or [],
            wait_s=args.wait_s,
        )
        # The node's result of it, as its document records it (gpufleet.cluster.node_take).
        remedy = lock.REMEDY_HELD.format(holder=args.holder, path=args.path)
        out["result"] = lock.result(out, args.path, args.run_id, asked, remedy)
    elif args.lock_command == "heartbeat":
        out = lock.heartbeat(args.path, args.run_id, args.holder)
    elif args.lock_command == "release":
        out = lock.release(args.path, args.run_id, args.holder)
    else:
        out = {"path": args.path, "record": lock.read(args.path)}
    print(json.dumps(out, sort_keys=True))
    return 0


def add_parsers(sub) -> None:
    """run and lock on the engine's subcommands."""
    run = sub.add_parser("run", help="on the controller: start (or resume) a run, its folder and its record")
    run_sub = run.add_subparsers(dest="run_command", required=True)
    rs = run_sub.add_parser(
        "start", help="check the run id and host names, create REPORTS_DIR/RUN_ID, record the attempt"
    )
    rs.add_argument("reports_dir", help="absolute folder of the run folders (gpufleet_reports_dir)")
    rs.add_argument("run_id", nargs="?", help="the run's name (gpufleet_run_id; default: the UTC time, minted here)")
    rs.add_argument("--playbook", default="validate", help="the playbook the attempt runs")
    rs.add_argument("--host", action="append", help="a node the attempt covers (repeatable)")
    rs.add_argument("--tier", help="the attempt's tier (gpufleet_tier)")
    rs.add_argument("--limit", help="the attempt's --limit, as given")
    rs.add_argument("--stage", action="append", help="a stage the attempt runs (repeatable; default: all)")
    rs.add_argument("--resume", action="store_true", help="add an attempt to an existing run instead of refusing it")
    rs.add_argument(
        "--dry-run", action="store_true", help="check as for a run, create and record nothing (validate.yml --check)"
    )
    rs.set_defaults(func=cmd_run_start)
    ra = run_sub.add_parser("alive", help="whether a run's controller process (a lock's `controller`) still runs here")
    ra.add_argument(
        "--controller", required=True, help="the controller record, JSON: host, pid, started_ticks, boot_id"
    )
    ra.set_defaults(func=cmd_run_alive)
    rk = run_sub.add_parser("locks-kept", help="record in run.json the nodes whose lock the run could not give back")
    rk.add_argument("run_dir", help="the run folder")
    rk.add_argument("--kept", required=True, help="JSON {host: why the lock could not be given back}")
    rk.set_defaults(func=cmd_run_locks_kept)
    rp = run_sub.add_parser(
        "playbook", help="(the fleet runner's) ansible-playbook in place of this process, ending with the runner"
    )
    rp.add_argument("--runner", type=int, required=True, help="the runner's pid: ansible-playbook ends when it does")
    rp.add_argument("--vars", help="the private file of extra variables: removed when ansible-playbook is gone")
    rp.add_argument("command", nargs=argparse.REMAINDER, help="ansible-playbook and its arguments")
    rp.set_defaults(func=cmd_run_playbook)

    lk = sub.add_parser("lock", help="on a node: the lock that keeps two runs from measuring it at once")
    lk_sub = lk.add_subparsers(dest="lock_command", required=True)
    for name, what in (
        ("acquire", "take the lock for a run (or join it, for the same run)"),
        ("heartbeat", "the controller still waits on this holder's jobs"),
        ("release", "give the lock back"),
        ("show", "print the lock record"),
    ):
        one = lk_sub.add_parser(name, help=what)
        one.add_argument("--path", default=DEFAULT_LOCK_PATH, help="the lock file (gpufleet_lock_path)")
        if name != "show":
            one.add_argument("--run-id", required=True)
            one.add_argument("--holder", required=True, help="the inventory host taking it")
        if name == "acquire":
            one.add_argument("--ttl-s", type=float, required=True, help="seconds the lease lasts unless given back")
            one.add_argument("--controller", help="JSON of the controller that runs the run (gpufleet run start)")
            one.add_argument("--dead-run", action="append", help="a run the controller knows was killed (repeatable)")
            one.add_argument(
                "--wait-s",
                type=float,
                default=0,
                help="seconds to wait while another run holds the node (gpufleet_lock_wait_s; default 0)",
            )
        one.set_defaults(func=cmd_lock)
