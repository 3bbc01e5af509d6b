"""A host document written into its run folder (`gpufleet record`, node_validate, the sweeps): RUN_DIR/hosts/HOST.json
or peers/HOST.json, atomically, merged with the results already there, an earlier attempt's document kept as it was,
an unreadable one kept aside; refused when the run's controller is gone."""

from __future__ import annotations

import json
import os
from pathlib import Path

from gpufleet.base import paths, runs, schema
from gpufleet.base.errors import InputError


def _attempt(run_dir: Path) -> int:
    """The run's latest attempt (run.json), 1 for a run without a record."""
    try:
        return len(runs.read_run(run_dir)["attempts"]) or 1
    except InputError:
        return 1


FOLDERS = ("hosts", "peers")  # nodes of the run; known-good peers that only joined its run across nodes


def record(
    run_dir: Path,
    host: str,
    new_doc: dict,
    replace_groups: list[str] | None = None,
    folder: str = "hosts",
    controller: dict | None = None,
) -> dict:
    """Write RUN_DIR/FOLDER/HOST.json, atomically, readable by owner and group.

    `controller`: the run's controller as the writer knows it (run start's record of the ansible-playbook main
    process). When it is gone, the writer is what a stopped run left behind (a worker of a killed ansible-playbook,
    whose node another run may measure by now): refused, so nothing it measured is taken for a normal run's figures.

    Without replace_groups the document is written whole. With them it is merged as the playbook adds results
    to a node's document: the existing document's results of those groups are dropped, new_doc's added, the
    rest kept; a node without a document gets new_doc. An existing document that cannot be read is kept aside
    as HOST.json.unreadable (never lost), and the document written gets an `error` result `results_file`
    naming it. Returns what it did.
    """
    paths.safe_name(host, "the host name")
    if folder not in FOLDERS:
        raise InputError(f"--folder {folder!r}; expected one of {', '.join(FOLDERS)}")
    if not run_dir.is_dir():
        raise InputError(
            f"run directory {run_dir} does not exist; expected the run's folder (gpufleet run start makes it)"
        )
    if controller and runs.controller_alive(controller) is False:
        raise InputError(
            f"the document of {host} is not written: the controller of run {runs.run_id_of(run_dir)} "
            f"(ansible-playbook pid {controller.get('pid')} on {controller.get('host')}) is gone, so this "
            "comes from a process its stopped run left behind; the node's next run measures it again"
        )
    hosts_dir = paths.make_dir(run_dir / folder)
    path = hosts_dir / f"{host}.json"  # a plain name (safe_name): a link there is kept aside, never followed
    new_results = list(new_doc["results"])
    groups = list(dict.fromkeys(replace_groups or []))
    kept_aside = None
    attempt = _attempt(run_dir)
    with paths.folder_lock(hosts_dir):  # the read, merge and write of two `record`s never interleave
        merged = dict(new_doc)
        if os.path.lexists(path):
            raw, why = paths.read_bytes(path)
            old, why = schema.parse_host_doc(raw) if raw is not None else (None, why)
            if old is None:
                kept_aside = path.with_name(f"{host}.json.unreadable")
                try:
                    os.replace(path, kept_aside)
                except OSError as exc:
                    raise InputError(
                        f"cannot keep the unreadable {path} aside as {kept_aside}: {exc.strerror}"
                    ) from None
                rel = f"{folder}/{kept_aside.name}"
                what = f"add the {', '.join(groups)} results to it" if groups else "replace it"
                error = schema.result(
                    "results_file",
                    schema.ERROR,
                    f"the host document could not be read to {what} ({why}); what it held is in {rel}",
                    group=schema.REPORT_GROUP,
                    detail={"file": rel},
                    started=schema.utc_now(),
                    seconds=0.0,
                    remedy=f"look at the .unreadable file; re-run validate.yml --limit {host} to check the node again",
                )
                merged = dict(new_doc, results=new_results + [error])
            else:
                if (old.get("attempt") or 1) < attempt:
                    # A resumed run changes a document an earlier attempt wrote: that one is kept as it was.
                    keep = paths.make_dir(
                        paths.inside(run_dir, "attempts", str(old.get("attempt") or 1), folder, what="attempts")
                    )
                    paths.write_atomic(keep / f"{host}.json", raw.decode("utf-8"))
                if groups:
                    kept = [r for r in old["results"] if not (isinstance(r, dict) and r.get("group") in groups)]
                    merged = dict(old, results=kept + new_results)
        merged["attempt"] = attempt
        paths.write_atomic(path, json.dumps(merged, indent=1, sort_keys=True, default=str) + "\n")
    return {
        "run_id": runs.run_id_of(run_dir),
        "host": host,
        "folder": folder,
        "path": str(path),
        "results": len(merged["results"]),
        "replaced_groups": groups,
        "unreadable_kept": str(kept_aside) if kept_aside else None,
    }
