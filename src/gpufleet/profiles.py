"""Threshold profiles per GPU model, picked from the detected GPU name.

`files/profiles/generic.yml` declares every threshold key with its default and
source, and bounds numbers with `min` and `max`; a model profile overrides some
keys; inventory overrides any key (`gpufleet_thresholds`). Unknown keys, wrong
types and numbers out of bounds (a negative minimum, a fraction over 1) are
refused with a message that names the file or variable and the key.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from gpufleet import calibration
from gpufleet.errors import InputError

GENERIC = "generic"


class ProfileError(InputError):
    """A profile file or an override is not what was expected."""


def default_profile_dir() -> Path:
    env = os.environ.get("GPUFLEET_PROFILE_DIR")
    if env:
        return Path(env)
    # Installed beside the package (wheel) or in the source checkout.
    here = Path(__file__).resolve().parent
    for cand in (here / "profiles", here.parent.parent / "files" / "profiles"):
        if (cand / f"{GENERIC}.yml").is_file():
            return cand
    raise ProfileError(
        f"no profile directory: neither {here / 'profiles'} nor "
        f"{here.parent.parent / 'files' / 'profiles'} holds {GENERIC}.yml; "
        "set GPUFLEET_PROFILE_DIR or --profile-dir"
    )


def _load_file(path: Path) -> dict:
    try:
        doc = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ProfileError(f"profile file {path} does not parse as YAML: {exc}") from None
    except OSError as exc:
        raise ProfileError(f"profile file {path} cannot be read: {exc.strerror}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("name"), str):
        raise ProfileError(f"profile file {path}: expected a mapping with a 'name' string")
    thresholds = doc.get("thresholds") or {}
    if not isinstance(thresholds, dict):
        raise ProfileError(f"profile file {path}: 'thresholds' must be a mapping of key -> {{value, source}}")
    for key, entry in thresholds.items():
        if not isinstance(entry, dict) or "value" not in entry or not entry.get("source"):
            raise ProfileError(
                f"profile file {path}: threshold '{key}' must be a mapping with 'value' and a non-empty 'source'"
            )
    for field in ("match", "exclude"):
        if not isinstance(doc.get(field, []), list):
            raise ProfileError(f"profile file {path}: '{field}' must be a list of name substrings")
    doc["path"] = str(path)
    return doc


_TYPES = {
    "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "str": lambda v: isinstance(v, str),
    "bool": lambda v: isinstance(v, bool),
    "list": lambda v: isinstance(v, list),
}


def _type_ok(kind: str, value: Any) -> bool:
    """null is always allowed: it means "no expectation"."""
    return value is None or _TYPES[kind](value)


def _bounds_problem(entry: dict, value: Any) -> str | None:
    """What a number outside the key's declared bounds (generic.yml's min and max) should have been; None when
    it is inside them, null, or the key is not a number."""
    lo, hi = entry.get("min"), entry.get("max")
    if value is None or not _TYPES["number"](value) or ((lo is None or value >= lo) and (hi is None or value <= hi)):
        return None
    kind = "an integer" if entry["type"] == "int" else "a number"
    if lo is not None and hi is not None:
        return f"expected {kind} from {lo} to {hi}"
    return f"expected {kind} of at least {lo}" if lo is not None else f"expected {kind} of at most {hi}"


def load_all(profile_dir: Path | None = None) -> dict[str, dict]:
    profile_dir = Path(profile_dir) if profile_dir else default_profile_dir()
    profiles = {}
    for path in sorted(profile_dir.glob("*.yml")):
        doc = _load_file(path)
        profiles[doc["name"]] = doc
    if GENERIC not in profiles:
        raise ProfileError(f"profile directory {profile_dir} has no {GENERIC}.yml (the base of every profile)")
    base = profiles[GENERIC]["thresholds"]
    for key, entry in base.items():
        if entry.get("type") not in _TYPES:
            raise ProfileError(
                f"profile file {profiles[GENERIC]['path']}: threshold '{key}' needs a 'type', one of {', '.join(_TYPES)}"
            )
        for bound in ("min", "max"):
            if bound in entry and not (entry["type"] in ("int", "number") and _TYPES["number"](entry[bound])):
                raise ProfileError(f"profile file {profiles[GENERIC]['path']}: threshold '{key}' {bound} = {entry[bound]!r}; "
                                   "expected a number, on an int or number threshold only")
    for name, doc in profiles.items():
        for key, entry in doc["thresholds"].items():
            if key not in base:
                raise ProfileError(f"profile file {doc['path']}: unknown threshold '{key}'; known: {', '.join(sorted(base))}")
            if not _type_ok(base[key]["type"], entry["value"]):
                raise ProfileError(
                    f"profile file {doc['path']}: threshold '{key}' = {entry['value']!r}; expected {base[key]['type']} or null"
                )
            why = _bounds_problem(base[key], entry["value"])
            if why:
                raise ProfileError(f"profile file {doc['path']}: threshold '{key}' = {entry['value']!r}; {why} (or null)")
    return profiles


def match(profiles: dict[str, dict], gpu_name: str | None) -> str | None:
    """Name of the profile whose `match` substrings hit the GPU name, or None."""
    if not gpu_name:
        return None
    low = gpu_name.lower()
    for name, doc in profiles.items():
        if name == GENERIC:
            continue
        if any(s.lower() in low for s in doc.get("match", [])) and not any(
            s.lower() in low for s in doc.get("exclude", [])
        ):
            return name
    return None


def resolve(
    gpu_name: str | None,
    *,
    profile_name: str | None = None,
    overrides: dict | None = None,
    profile_dir: Path | None = None,
) -> dict:
    """The effective profile: generic <- model profile <- inventory overrides.

    Returns {"name", "matched", "note", "thresholds": {key: {"value", "source"}}, "calibration"}; a relative
    limit's entry also says whether it is `calibrated` and its per-metric values (`by_metric`, calibration.py).
    """
    profiles = load_all(profile_dir)
    note = None
    if profile_name:
        if profile_name not in profiles:
            raise ProfileError(
                f"gpufleet_profile = {profile_name!r} is not a known profile; expected one of {', '.join(sorted(profiles))}"
            )
        name = profile_name
    else:
        name = match(profiles, gpu_name)
        if name is None:
            name = GENERIC
            note = (
                f"no profile matches GPU {gpu_name!r}; using the generic profile, so model figures "
                "(memory, PCIe generation, NVLink links) are not checked"
                if gpu_name
                else "no GPU detected; using the generic profile"
            )
    thresholds = {k: {"value": v["value"], "source": v["source"]} for k, v in profiles[GENERIC]["thresholds"].items()}
    for key, entry in profiles[name]["thresholds"].items():
        thresholds[key] = {"value": entry["value"], "source": entry["source"]}
    # The model's measured healthy spread sets its relative limits per metric; an inventory override still wins.
    thresholds, calibrated = calibration.apply(thresholds, name, profiles[name]["path"])
    for key, value in (overrides or {}).items():
        if key not in thresholds:
            raise ProfileError(
                f"gpufleet_thresholds.{key} is not a known threshold; expected one of {', '.join(sorted(thresholds))}"
            )
        kind = profiles[GENERIC]["thresholds"][key]["type"]
        if not _type_ok(kind, value):
            raise ProfileError(f"gpufleet_thresholds.{key} = {value!r} has the wrong type; expected {kind} or null")
        why = _bounds_problem(profiles[GENERIC]["thresholds"][key], value)
        if why:
            raise ProfileError(f"gpufleet_thresholds.{key} = {value!r} is out of bounds; {why} (or null)")
        thresholds[key] = {"value": value, "source": "inventory override (gpufleet_thresholds)"}
    return {
        "name": name,
        "matched": name != GENERIC or profile_name == GENERIC,
        "note": note,
        "path": profiles[name]["path"],
        "thresholds": thresholds,
        "calibration": calibrated,
    }


def value(profile: dict, key: str) -> Any:
    return profile["thresholds"][key]["value"]


def threshold(profile: dict, key: str, **extra: Any) -> dict:
    """A result's `threshold` field: the key, its value and its source."""
    entry = profile["thresholds"][key]
    return {"key": key, "value": entry["value"], "source": entry["source"], **extra}
