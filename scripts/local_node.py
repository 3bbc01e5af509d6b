"""What `make validate` on inventory/local tells the run about this machine as its node, said at the start.

    the node's Python   NODE_PYTHON when given; else the first of the controller's .venv and the machine's own
                        python3 that has torch with CUDA and nvidia-ml-py; one with torch and CUDA but without
                        nvidia-ml-py or PyYAML gets them in .venv/node, a venv over its packages. The engine goes
                        into .venv/node too (pip install --no-deps -e .), so every gpufleet command on the node finds
                        it. Without a CUDA torch on the machine, the .venv: its benchmarks then say why, once.
    the GPUs expected   EXPECTED_GPUS when given; else what NVML sees where the matched profile expects another
                        count (an HGX profile expects 8 on a 4-GPU machine), saying so; else the profile's.

Writes the variables inventory/local reads (local_node_python, local_node_gpus_expected) as JSON for
`ansible-playbook -e @FILE`, and prints what it chose and how to change it. Standard library only: it runs under
the controller's .venv and asks each Python in a process of its own.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# Asked of each candidate: what it has, without failing where it lacks something.
PROBE = r"""
import json, sys
out = {"executable": sys.executable, "version": sys.version.split()[0]}
for mod in ("yaml", "pynvml"):
    try:
        __import__(mod)
        out[mod] = True
    except Exception:
        out[mod] = False
try:
    import torch
    out["torch"] = torch.__version__
    out["cuda"] = bool(torch.cuda.is_available())
    out["cuda_devices"] = torch.cuda.device_count() if out["cuda"] else 0
except Exception as exc:
    out["torch"], out["cuda"], out["why"] = None, False, f"{type(exc).__name__}: {exc}"
print(json.dumps(out))
"""
# What NVML sees and the profile the engine would match, asked of the controller's .venv (it has the engine).
GPUS = r"""
import json
from gpufleet.base import profiles
from gpufleet.collect import nvml
reading = nvml.read()
gpus = reading.get("gpus") or []
name = gpus[0].get("name") if gpus else None
profile = profiles.resolve(name)
entry = profile["thresholds"]["gpus_expected"]
print(json.dumps({"available": bool(reading.get("available")), "error": reading.get("error"), "count": len(gpus),
                  "name": name, "profile": profile["name"], "expected": entry["value"], "source": entry["source"]}))
"""


def say(text: str) -> None:
    print(f"make validate: {text}", flush=True)


def probe(python: str) -> dict | None:
    try:
        done = subprocess.run([python, "-c", PROBE], capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired):
        return None
    try:
        return json.loads(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return None


def candidates(venv_python: str) -> list[str]:
    """The controller's .venv, then python3 on PATH outside it, then the usual places."""
    venv_bin = str(Path(venv_python).parent)
    path = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep) if p and p != venv_bin)
    found = [venv_python, shutil.which("python3", path=path) or "", "/usr/bin/python3", "/usr/local/bin/python3"]
    return list(dict.fromkeys(p for p in found if p and os.path.exists(p)))


def usable(info: dict | None) -> bool:
    return bool(info and info.get("torch") and info.get("cuda") and info.get("pynvml") and info.get("yaml"))


# The package folders of a Python, one a line (a venv's own, then its base's), for a .pth of the node venv.
BASE_SITE = "import site, sys; print('\\n'.join(dict.fromkeys(p for p in site.getsitepackages() + [site.getusersitepackages()] if p)))"


def node_venv(base: str, venv: Path) -> str:
    """.venv/node: a venv over `base`'s packages (its torch) with the engine, and nvidia-ml-py and PyYAML where
    `base` lacks them; pip as configured (a local wheelhouse where the machine reaches no registry)."""
    python = venv / "bin" / "python"
    stamp = venv / ".base"
    if not (python.exists() and stamp.exists() and stamp.read_text().strip() == base):
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run([base, "-m", "venv", "--system-site-packages", str(venv)], check=True)
        # --system-site-packages reaches the base interpreter's packages, not those of a venv `base` may itself be
        # (a machine's torch often lives in one): a .pth names `base`'s own package folders.
        folders = subprocess.run([base, "-c", BASE_SITE], capture_output=True, text=True, check=True).stdout
        ours = subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        (Path(ours) / "gpufleet-node-base.pth").write_text(folders)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", "-e", str(REPO)], check=True)
        info = probe(str(python)) or {}
        missing = [pkg for mod, pkg in (("pynvml", "nvidia-ml-py>=12.535"), ("yaml", "PyYAML>=6")) if not info.get(mod)]
        if missing:
            subprocess.run([str(python), "-m", "pip", "install", "-q", *missing], check=True)
        stamp.write_text(base + "\n")
    return str(python)


def choose_python(given: str, venv_python: str, venv: Path) -> tuple[str, str]:
    """(the node's Python, what to say of it)."""
    if given:
        info = probe(given)
        if info is None:
            raise SystemExit(f"make validate: NODE_PYTHON={given} does not run; expected a Python interpreter")
        lacks = [
            what
            for what, ok in (
                ("torch", info.get("torch")),
                ("CUDA", info.get("cuda")),
                ("nvidia-ml-py", info.get("pynvml")),
                ("PyYAML", info.get("yaml")),
            )
            if not ok
        ]
        node = node_venv(given, venv) if given != venv_python else given
        return node, (
            f"NODE_PYTHON={given}"
            + (f", with the engine in {venv}" if node != given else "")
            + (f"; it lacks {', '.join(lacks)}" if lacks else f": torch {info['torch']} with CUDA, nvidia-ml-py")
            + (" (nvidia-ml-py and PyYAML installed beside it)" if node != given and lacks else "")
        )
    probes = {p: probe(p) for p in candidates(venv_python)}
    for python, info in probes.items():
        if usable(info):
            where = "the controller's .venv" if python == venv_python else f"this machine's own {python}"
            node = python if python == venv_python else node_venv(python, venv)
            return node, (
                f"{where}: torch {info['torch']} with CUDA ({info['cuda_devices']} device(s)), nvidia-ml-py"
                + ("" if node == python else f"; the engine beside them in {venv}")
            )
    for python, info in probes.items():
        if info and info.get("torch") and info.get("cuda"):
            node = node_venv(python, venv)
            return node, (
                f"this machine's own {python}: torch {info['torch']} with CUDA; nvidia-ml-py and PyYAML installed "
                f"beside it in {venv}"
            )
    info = probes.get(venv_python) or {}
    how = "to measure, give a Python with torch (CUDA) and nvidia-ml-py: make validate NODE_PYTHON=/path/to/python"
    if info.get("torch"):
        return (
            venv_python,
            f"the controller's .venv: torch {info['torch']} without CUDA, so the benchmarks run on the CPU (no figure); {how}",
        )
    return (
        venv_python,
        f"the controller's .venv, which has no torch: no Python here has it, so each benchmark says so; {how}",
    )


def expected_gpus(given: str, venv_python: str) -> tuple[int | None, str]:
    """(the count to expect, or None for the profile's; what to say of it)."""
    done = subprocess.run([venv_python, "-c", GPUS], capture_output=True, text=True, timeout=120)
    try:
        seen = json.loads(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return (int(given) if given else None), f"GPUs not read ({done.stderr.strip()[-300:]})"
    change = "make validate EXPECTED_GPUS=N (or gpufleet_thresholds.gpus_expected in an inventory of your own)"
    if given:
        return int(given), f"{given} GPU(s) expected, as EXPECTED_GPUS says; NVML sees {seen['count']}"
    if not seen["available"]:
        return None, f"{seen['error']}: no GPU to check, the node will not be accepted"
    found = f"{seen['count']} x {seen['name']}, profile {seen['profile']}"
    if seen["expected"] == seen["count"]:
        return None, f"{found}, which expects {seen['expected']} GPU(s) ({seen['source']}); to change it: {change}"
    if seen["expected"] is None:
        return seen[
            "count"
        ], f"{found}, which sets no GPU count: expecting what NVML sees, {seen['count']}; to change it: {change}"
    return seen["count"], (
        f"{found}, which expects {seen['expected']} ({seen['source']}): expecting what NVML sees on this "
        f"machine, {seen['count']}; to hold it to {seen['expected']}: make validate "
        f"EXPECTED_GPUS={seen['expected']}"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="the variables file for ansible-playbook -e @FILE")
    ap.add_argument("--node-python", default="", help="NODE_PYTHON: the node's Python, as given")
    ap.add_argument("--expected-gpus", default="", help="EXPECTED_GPUS: the GPU count to expect, as given")
    args = ap.parse_args()
    if args.expected_gpus and not (args.expected_gpus.isdigit() and int(args.expected_gpus) > 0):
        raise SystemExit(
            f"make validate: EXPECTED_GPUS={args.expected_gpus!r}; expected a whole number of GPUs, 1 or more"
        )
    venv_python = sys.executable
    venv = Path(venv_python).parent.parent / "node"
    try:
        python, why = choose_python(args.node_python, venv_python, venv)
    except subprocess.CalledProcessError as exc:  # pip or venv could not make .venv/node (no registry, no wheel)
        raise SystemExit(
            f"make validate: could not make {venv} for the node's Python: `{' '.join(map(str, exc.cmd))}` "
            f"exited {exc.returncode}; where no package registry is reachable, point pip at a wheelhouse "
            "(PIP_NO_INDEX=1 PIP_FIND_LINKS=/path/to/wheels), or give NODE_PYTHON"
        ) from None
    say(f"the node's Python: {python}, {why}")
    count, what = expected_gpus(args.expected_gpus, venv_python)
    say(f"GPUs: {what}")
    out = {"local_node_python": python}
    if count is not None:
        out["local_node_gpus_expected"] = count
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
