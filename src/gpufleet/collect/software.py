"""The node's software and firmware beside what NVML gives (driver, CUDA, VBIOS, InfoROM: collect/nvml/): the
HCAs' firmware and board id, OFED or rdma-core, NCCL (the library torch uses and every libnccl the dynamic loader
would find), the NCCL net plugin NCCL would load (path and sha256 of its content), and torch.

`read(root, environ)` never raises. Every path is read under `root`, so tests replay a fake tree; paths are
recorded as the node sees them (without `root`). A value that could not be read is None with a `reason`
beside it. torch is the engine's own Python's, found without importing it (an import takes seconds).

Keys:
  hcas             {path, present, reason, hcas: [{hca, fw_ver, board_id, reason}]}
  ofed             {version, command, reason}           `ofed_info -s` (MLNX_OFED, DOCA-OFED), found on PATH
  rdma_core        {version, source, reason}            the rdma-core package (dpkg status), else the version in
                                                        the file name of libibverbs.so.1.*
  library_dirs     [dir]                                where the dynamic loader looks, in its order:
                                                        LD_LIBRARY_PATH, /etc/ld.so.conf (and its includes), the
                                                        default folders
  nccl             {torch: {path, version, package, reason},
                    libraries: [{path, real_path, version, reason}], loads: path | None, reason}
  nccl_net_plugin  {setting, setting_source, candidates, loads: {path, sha256, size_bytes} | None,
                    found: [{path, sha256, size_bytes}], reason}
  torch            {version, cuda, path, reason}
"""

from __future__ import annotations

import ast
import glob
import hashlib
import importlib.metadata
import importlib.util
import os
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Mapping

from gpufleet.collect.host import parse_nccl_conf, read_text

COMMAND_TIMEOUT_S = 20
NCCL_PIP_PACKAGES = ("nvidia-nccl-cu13", "nvidia-nccl-cu12", "nvidia-nccl-cu11")
RDMA_CORE_PACKAGES = ("rdma-core", "libibverbs1", "libibverbs")
# ncclGetVersion in a process of its own: a library that crashes on load must not take the engine with it.
_NCCL_VERSION_CODE = (
    "import ctypes, sys\n"
    "lib = ctypes.CDLL(sys.argv[1])\n"
    "code = ctypes.c_int(0)\n"
    "print(lib.ncclGetVersion(ctypes.byref(code)), code.value)\n"
)


def nccl_version_text(code) -> str:
    """NCCL's version as text: torch's (2, 21, 5) or ncclGetVersion's 22105 (2.9 on) / 2708 (before 2.9)."""
    if isinstance(code, (tuple, list)):
        return ".".join(str(part) for part in code if part not in ("", None))
    code = int(code)
    if code >= 20900:
        return f"{code // 10000}.{code % 10000 // 100}.{code % 100}"
    return f"{code // 1000}.{code % 1000 // 100}.{code % 100}"


def _on_node(root: Path, path: Path) -> str:
    """The path as the node sees it."""
    text = str(path)
    base = str(root).rstrip("/")
    return "/" + text[len(base) :].lstrip("/") if base and text.startswith(base + "/") else text


def _sha256(path: Path) -> tuple[str | None, int | None, str | None]:
    """(hex digest, size in bytes, None) or (None, None, reason); read in blocks."""
    digest, size = hashlib.sha256(), 0
    try:
        with open(path, "rb") as fh:
            while block := fh.read(1 << 20):
                digest.update(block)
                size += len(block)
    except OSError as exc:
        return None, None, f"{path}: {exc.strerror or exc}"
    return digest.hexdigest(), size, None


# --- HCAs, OFED, rdma-core -----------------------------------------------------------------------


def _read_hcas(root: Path) -> dict:
    base = root / "sys/class/infiniband"
    try:
        names = sorted(os.listdir(base))
    except OSError as exc:
        return {
            "path": str(base),
            "present": False,
            "hcas": [],
            "reason": f"{base}: {'not present' if isinstance(exc, FileNotFoundError) else exc.strerror or exc}",
        }
    hcas = []
    for name in names:
        (fw, fw_reason), (board, board_reason) = read_text(base / name / "fw_ver"), read_text(base / name / "board_id")
        hcas.append(
            {
                "hca": name,
                "fw_ver": fw,
                "board_id": board,
                "reason": "; ".join(r for r in (fw_reason, board_reason) if r) or None,
            }
        )
    return {"path": str(base), "present": True, "hcas": hcas, "reason": None if hcas else f"{base} is empty"}


def _which(root: Path, name: str, environ: Mapping[str, str]) -> Path | None:
    dirs = [d for d in environ.get("PATH", os.defpath).split(os.pathsep) if d.startswith("/")]
    for folder in dict.fromkeys(dirs + ["/usr/bin", "/usr/sbin", "/bin", "/sbin"]):
        path = shutil.which(name, path=str(root / folder.lstrip("/")))
        if path:
            return Path(path)
    return None


def _read_ofed(root: Path, environ: Mapping[str, str]) -> dict:
    exe = _which(root, "ofed_info", environ)
    if exe is None:
        return {"version": None, "command": None, "reason": "ofed_info not found on PATH: no MLNX_OFED or DOCA-OFED"}
    cmd = [str(exe), "-s"]
    try:
        proc = subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT_S,
            stdin=subprocess.DEVNULL,
            env={"PATH": environ.get("PATH", os.defpath), "LC_ALL": "C"},
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"version": None, "command": cmd, "reason": f"{' '.join(cmd)} could not run: {exc}"}
    text = proc.stdout.strip().splitlines()[0].strip().rstrip(":") if proc.stdout.strip() else ""
    if proc.returncode != 0 or not text:
        return {
            "version": None,
            "command": cmd,
            "reason": f"{' '.join(cmd)} gave rc {proc.returncode} and {text or 'no output'}: {proc.stderr.strip()[-300:]}",
        }
    return {"version": text, "command": cmd, "reason": None}


def dpkg_versions(text: str, packages: tuple[str, ...]) -> dict[str, str]:
    """{package: version} of the installed ones among `packages`, from /var/lib/dpkg/status."""
    out = {}
    for stanza in text.split("\n\n"):
        fields = dict(re.findall(r"^([A-Za-z-]+): ?(.*)$", stanza, flags=re.M))
        if fields.get("Package") in packages and "installed" in fields.get("Status", "").split():
            out[fields["Package"]] = fields.get("Version")
    return out


def _read_rdma_core(root: Path, library_dirs: list[str]) -> dict:
    status = root / "var/lib/dpkg/status"
    text, _ = read_text(status)
    installed = dpkg_versions(text or "", RDMA_CORE_PACKAGES)
    for package in RDMA_CORE_PACKAGES:
        if package in installed:
            return {
                "version": installed[package],
                "source": f"package {package} ({_on_node(root, status)})",
                "reason": None,
            }
    for folder in library_dirs:
        for name in sorted(glob.glob(str(root / folder.lstrip("/") / "libibverbs.so.1.*"))):
            m = re.search(r"libibverbs\.so\.(1\.[\d.]+)$", name)
            if m:
                return {"version": f"libibverbs {m.group(1)}", "source": _on_node(root, Path(name)), "reason": None}
    return {
        "version": None,
        "source": None,
        "reason": f"no rdma-core package in {_on_node(root, status)} and no libibverbs.so.1.* in the loader's folders",
    }


# --- where the dynamic loader looks ------------------------------------------------------------------


def _ld_conf_dirs(root: Path, conf: Path, seen: set) -> list[str]:
    if conf in seen:
        return []
    seen.add(conf)
    text, _ = read_text(conf)
    out: list[str] = []
    for line in (text or "").splitlines():
        line = line.split("#", 1)[0].strip()
        if line.startswith("include "):
            pattern = line.split(None, 1)[1]
            pattern = pattern if pattern.startswith("/") else f"{_on_node(root, conf.parent)}/{pattern}"
            for name in sorted(glob.glob(str(root / pattern.lstrip("/")))):
                out += _ld_conf_dirs(root, Path(name), seen)
        elif line.startswith("/"):
            out.append(line)
    return out


def library_dirs(root: Path, environ: Mapping[str, str]) -> list[str]:
    """The folders the dynamic loader searches, in its order (its cache is built from ld.so.conf's folders)."""
    env = [d for d in environ.get("LD_LIBRARY_PATH", "").split(":") if d.startswith("/")]
    multiarch = f"{platform.machine()}-linux-gnu"
    defaults = [f"/lib/{multiarch}", f"/usr/lib/{multiarch}", "/lib64", "/usr/lib64", "/lib", "/usr/lib"]
    return list(dict.fromkeys(env + _ld_conf_dirs(root, root / "etc/ld.so.conf", set()) + defaults))


def _find(root: Path, name: str, dirs: list[str]) -> Path | None:
    """The file the loader would open for `name`: a path as it is, a bare name in the first folder holding it."""
    if "/" in name:
        path = root / name.lstrip("/") if name.startswith("/") else Path(name)
        return path if path.is_file() else None
    for folder in dirs:
        path = root / folder.lstrip("/") / name
        if path.is_file():
            return path
    return None


# --- NCCL -----------------------------------------------------------------------------------------------


def nccl_library_version(path: Path) -> tuple[str | None, str | None]:
    """(version, None) from ncclGetVersion of the library, else from its file name (libnccl.so.2.21.5), else
    (None, reason)."""
    named = re.search(r"libnccl\.so\.(\d+\.\d+\.\d+)$", path.name)
    try:
        proc = subprocess.run(
            [sys.executable, "-c", _NCCL_VERSION_CODE, str(path)],
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT_S,
            stdin=subprocess.DEVNULL,
            env={"LC_ALL": "C"},
        )
        rc, code = proc.stdout.split() if proc.returncode == 0 else (None, None)
    except (OSError, subprocess.TimeoutExpired, ValueError) as exc:
        proc, rc, code = None, None, f"{exc}"
    if rc == "0":
        return nccl_version_text(code), None
    if named:
        return named.group(1), None
    why = (
        f"ncclGetVersion returned {rc}"
        if rc
        else (proc.stderr.strip().splitlines() or ["no output"])[-1]
        if proc
        else code
    )
    return None, f"{path}: no version in its name and it could not be asked ({why})"


def _read_torch() -> dict:
    """torch of the engine's Python, without importing it."""
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError) as exc:
        spec, why = None, f"torch cannot be looked up: {exc}"
    else:
        why = f"torch is not installed in {sys.executable}'s environment"
    if spec is None or not spec.origin:
        return {"version": None, "cuda": None, "path": None, "reason": why}
    folder = Path(spec.origin).parent
    try:
        version = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        version = None
    text, reason = read_text(folder / "version.py")
    assignments = dict(re.findall(r"^(__version__|cuda)\s*(?::[^=]*)?=\s*(.+)$", text or "", flags=re.M))
    try:
        version = version or ast.literal_eval(assignments["__version__"])
        cuda = ast.literal_eval(assignments["cuda"]) if "cuda" in assignments else None
    except (ValueError, SyntaxError, KeyError):
        cuda = None
    return {
        "version": version,
        "cuda": cuda,
        "path": str(folder),
        "reason": None if version else reason or f"{folder}/version.py names no __version__",
    }


def _torch_nccl(torch: dict) -> dict:
    """The libnccl torch loads: its own lib/ folder, else the nvidia-nccl wheel's beside it (torch's RPATH)."""
    out: dict[str, Any] = {"path": None, "version": None, "package": None, "reason": None}
    for package in NCCL_PIP_PACKAGES:
        try:
            out["package"] = f"{package} {importlib.metadata.version(package)}"
            break
        except importlib.metadata.PackageNotFoundError:
            continue
    if not torch.get("path"):
        return out | {"reason": torch.get("reason")}
    if torch.get("cuda") is None:
        return out | {"reason": f"torch {torch.get('version')} is a build without CUDA: it has no NCCL"}
    folder = Path(torch["path"])
    for pattern in (folder / "lib" / "libnccl.so*", folder.parent / "nvidia" / "nccl" / "lib" / "libnccl.so*"):
        names = sorted(glob.glob(str(pattern)))
        if names:
            path = Path(names[0])
            version, reason = nccl_library_version(path)
            return out | {"path": str(path), "version": version, "reason": reason}
    return out | {
        "reason": f"no libnccl in {folder / 'lib'} or {folder.parent / 'nvidia/nccl/lib'}: torch may carry "
        "NCCL inside itself (`gpufleet hw` asks torch.cuda.nccl.version())"
    }


def _read_nccl(root: Path, dirs: list[str], torch: dict) -> dict:
    libraries, seen = [], set()
    for folder in dirs:
        for name in sorted(glob.glob(str(root / folder.lstrip("/") / "libnccl.so*"))):
            real = os.path.realpath(name)
            if real in seen or not os.path.isfile(real):
                continue
            seen.add(real)
            version, reason = nccl_library_version(Path(real))
            libraries.append(
                {
                    "path": _on_node(root, Path(name)),
                    "real_path": _on_node(root, Path(real)),
                    "version": version,
                    "reason": reason,
                }
            )
    loads = _find(root, "libnccl.so.2", dirs)
    return {
        "torch": _torch_nccl(torch),
        "libraries": libraries,
        "loads": _on_node(root, loads) if loads else None,
        "reason": None if libraries else "no libnccl.so* in LD_LIBRARY_PATH or the loader's folders",
    }


def _plugin_file(root: Path, path: Path) -> dict:
    sha, size, reason = _sha256(path)
    return {"path": _on_node(root, path), "sha256": sha, "size_bytes": size, "reason": reason}


def _read_net_plugin(root: Path, dirs: list[str], environ: Mapping[str, str]) -> dict:
    """The net plugin NCCL would load: NCCL_NET_PLUGIN's value as a library name or path, then
    libnccl-net-<value>.so; without the setting libnccl-net.so; `none` turns plugins off."""
    conf_path = root / "etc/nccl.conf"
    text, _ = read_text(conf_path)
    conf = parse_nccl_conf(text)[0] if text is not None else {}
    if "NCCL_NET_PLUGIN" in environ:
        setting, source = environ["NCCL_NET_PLUGIN"], "environment"
    elif "NCCL_NET_PLUGIN" in conf:
        setting, source = conf["NCCL_NET_PLUGIN"], _on_node(root, conf_path)
    else:
        setting, source = None, None
    if setting is not None and setting.lower() == "none":
        candidates = []
    elif setting:
        candidates = [setting, f"libnccl-net-{setting}.so"]
    else:
        candidates = ["libnccl-net.so"]
    plugin_files, seen = [], set()
    for folder in dirs:
        for name in sorted(glob.glob(str(root / folder.lstrip("/") / "libnccl-net*.so*"))):
            real = os.path.realpath(name)
            if real not in seen and os.path.isfile(real):
                seen.add(real)
                plugin_files.append(_plugin_file(root, Path(name)))
    path = next((p for p in (_find(root, c, dirs) for c in candidates) if p is not None), None)
    if path is not None:
        reason = None
    elif not candidates:
        reason = f"NCCL_NET_PLUGIN={setting} ({source}): NCCL uses its internal network transports"
    else:
        reason = (
            f"none of {', '.join(candidates)} in LD_LIBRARY_PATH or the loader's folders: NCCL uses its internal "
            "network transports"
        )
    return {
        "setting": setting,
        "setting_source": source,
        "candidates": candidates,
        "loads": _plugin_file(root, path) if path is not None else None,
        "found": plugin_files,
        "reason": reason,
    }


def read(root: str = "/", environ: Mapping[str, str] | None = None) -> dict:
    """The readings of the module docstring; never raises (a section that fails says why in its `reason`)."""
    environ = os.environ if environ is None else environ
    rootp = Path(root)
    dirs = library_dirs(rootp, environ)
    out: dict[str, Any] = {"library_dirs": dirs}

    def section(name: str, fn) -> None:
        try:
            out[name] = fn()
        except Exception as exc:  # one broken section must not hide the others
            out[name] = {"reason": f"reading it failed: {type(exc).__name__}: {exc}"}

    section("hcas", lambda: _read_hcas(rootp))
    section("ofed", lambda: _read_ofed(rootp, environ))
    section("rdma_core", lambda: _read_rdma_core(rootp, dirs))
    section("torch", _read_torch)
    section("nccl", lambda: _read_nccl(rootp, dirs, out["torch"]))
    section("nccl_net_plugin", lambda: _read_net_plugin(rootp, dirs, environ))
    return out
