"""The NCCL environment: NCCL_* variables, /etc/nccl.conf and the interfaces they name."""

from __future__ import annotations

from pathlib import Path
from typing import Mapping

from gpufleet.collect.host.files import listdir, read_text


def parse_nccl_conf(text: str) -> tuple[dict, list[dict]]:
    """NAME=VALUE lines the way NCCL reads them: split at the first '=', no trimming.

    Returns (values, ignored_lines). NCCL keeps spaces in names and values, so a
    line like 'NCCL_X = 1' sets a variable NCCL never looks up; those are
    reported as ignored with the reason.
    """
    values, ignored = {}, []
    for line_number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        name, sep, value = line.partition("=")
        if not sep:
            ignored.append({"line": line_number, "text": line, "reason": "no '=': NCCL skips it"})
        elif name != name.strip() or not name:
            ignored.append(
                {"line": line_number, "text": line, "reason": "spaces around the name: NCCL reads a different name"}
            )
        else:
            values.setdefault(name, value)  # NCCL's setenv(..., 0): the first line wins
    return values, ignored


def read_nccl(root: Path, environ: Mapping[str, str]) -> dict:
    # NCCL_VERSION is what NVIDIA's container images set to name the package, not a setting NCCL reads.
    env = {k: v for k, v in environ.items() if k.startswith("NCCL_") and k != "NCCL_VERSION"}
    conf_path = root / "etc/nccl.conf"
    text, reason = read_text(conf_path)
    values, ignored = parse_nccl_conf(text) if text is not None else ({}, [])
    effective = {k: {"value": v, "source": str(conf_path)} for k, v in values.items()}
    effective.update({k: {"value": v, "source": "environment"} for k, v in env.items()})  # env wins, as in NCCL
    net = root / "sys/class/net"
    interfaces = {name: read_text(net / name / "operstate")[0] for name in listdir(net) or []}
    return {
        "env": env,
        "conf": {
            "path": str(conf_path),
            "present": text is not None,
            "values": values,
            "ignored_lines": ignored,
            "reason": reason,
        },
        "effective": effective,
        "interfaces": interfaces,
        "interfaces_path": str(net),
        "not_read": "~/.nccl.conf of the job's user (sits between the environment and /etc/nccl.conf)",
    }
