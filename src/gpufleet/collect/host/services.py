"""Services the node needs: NVIDIA Fabric Manager (asked of systemctl only where there is an NVSwitch)."""

from __future__ import annotations

import os
import shutil
import subprocess
from typing import Mapping

FABRICMANAGER_UNIT = "nvidia-fabricmanager"
SYSTEMCTL_TIMEOUT_S = 10


def systemctl_is_active(unit: str, environ: Mapping[str, str], timeout_s: float = SYSTEMCTL_TIMEOUT_S) -> dict:
    """Ask `systemctl is-active UNIT`, finding systemctl on environ's PATH."""
    search = environ.get("PATH", os.defpath)
    exe = shutil.which("systemctl", path=search)
    if not exe:
        return {
            "asked": False,
            "state": None,
            "rc": None,
            "command": None,
            "reason": f"systemctl not found on PATH ({search})",
        }
    cmd = [exe, "is-active", unit]
    try:
        proc = subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            stdin=subprocess.DEVNULL,
            env={"PATH": search, "LC_ALL": "C"},
        )
    except subprocess.TimeoutExpired:
        return {
            "asked": False,
            "state": None,
            "rc": None,
            "command": cmd,
            "reason": f"{' '.join(cmd)} gave no answer within {timeout_s} s",
        }
    except OSError as exc:
        return {
            "asked": False,
            "state": None,
            "rc": None,
            "command": cmd,
            "reason": f"{' '.join(cmd)} could not run: {exc.strerror or exc}",
        }
    lines = proc.stdout.strip().splitlines()
    return {
        "asked": True,
        "state": lines[0].strip() if lines else None,
        "rc": proc.returncode,
        "command": cmd,
        "stderr": proc.stderr.strip()[-500:] or None,
        "reason": None if lines else f"{' '.join(cmd)} printed nothing (rc {proc.returncode})",
    }


def read_fabricmanager(pci: list[dict], environ: Mapping[str, str]) -> dict:
    if not any(d["kind"] == "nvswitch" for d in pci):
        return {
            "asked": False,
            "state": None,
            "rc": None,
            "command": None,
            "reason": "no NVSwitch on the PCI bus; fabric manager not needed",
        }
    return systemctl_is_active(FABRICMANAGER_UNIT, environ)
