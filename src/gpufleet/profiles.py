"""Threshold profiles per GPU model, picked from the detected GPU name.

`files/profiles/generic.yml` declares every threshold key with its default and
source, and bounds numbers with `min` and `max`; a model profile overrides some
keys; inventory overrides any key (`gpufleet_thresholds`). Unknown keys, wrong
types and numbers out of bounds (a negative minimum, a fraction over 1) are
refused with a message that names the file or variable and the key.

A site's own profiles (validate.yml's `gpufleet_profile_dir`) come before the
shipped ones: matched first, and one of the same name replaces the shipped one.
On a node they come from GPUFLEET_SITE_PROFILES, the folder's files as
{controller path: YAML text} (the role passes them to every engine process it
starts there), or GPUFLEET_SITE_PROFILE_DIR, a folder on the node itself. A
profile that says `uncalibrated: <why>` has figures nobody measured yet.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import yaml

from gpufleet import calibration
from gpufleet.errors import InputError, did_you_mean

GENERIC = "generic"
SITE_DIR_ENV = "GPUFLEET_SITE_PROFILE_DIR"
SITE_TEXTS_ENV = "GPUFLEET_SITE_PROFILES"
SITE_VARIABLE = "gpufleet_profile_dir"
UNKNOWN_KEY = f"expected a key of files/profiles/{GENERIC}.yml, which declares every threshold"


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
        text = path.read_text()
    except OSError as exc:
        raise ProfileError(f"profile file {path} cannot be read: {exc.strerror}") from None
    return _parse(text, path)


def _parse(text: str, path: Path | str) -> dict:
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ProfileError(f"profile file {path} does not parse as YAML: {exc}") from None
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
    if not isinstance(doc.get("uncalibrated", ""), str):
        raise ProfileError(f"profile file {path}: 'uncalibrated' must say why (a string), or be left out")
    doc["path"] = str(path)
    return doc


def site_profiles(site_dir: Path | str | None = None) -> list[dict]:
    """The site's own profiles: those of `site_dir`, else of the environment (SITE_TEXTS_ENV, SITE_DIR_ENV)."""
    texts = os.environ.get(SITE_TEXTS_ENV) if site_dir is None else None
    if texts:
        try:
            files = json.loads(texts)
        except ValueError as exc:
            raise ProfileError(
                f"{SITE_TEXTS_ENV} is not JSON ({exc}); expected {{profile file: its YAML text}}"
            ) from None
        if not isinstance(files, dict):
            raise ProfileError(f"{SITE_TEXTS_ENV}: expected {{profile file: its YAML text}}")
        docs = [_parse(str(text), f"{SITE_VARIABLE} {name}") for name, text in sorted(files.items())]
    else:
        folder = site_dir or os.environ.get(SITE_DIR_ENV)
        if not folder:
            return []
        if not Path(folder).is_dir():
            raise ProfileError(f"{SITE_VARIABLE} {folder} is not a folder; expected a folder of profile YAML files")
        docs = [_load_file(path) for path in sorted(Path(folder).glob("*.yml"))]
        if not docs:
            raise ProfileError(f"{SITE_VARIABLE} {folder} holds no profile (*.yml); expected the site's profile files")
    for doc in docs:
        if doc["name"] == GENERIC:
            raise ProfileError(
                f"profile file {doc['path']}: a site profile cannot replace {GENERIC}.yml, which declares "
                "every key; set a site-wide value through gpufleet_thresholds"
            )
        doc["site"] = True
    return docs


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
    it is inside them, null, or the key is not a number. NaN and infinity are no number to hold a reading
    against: every comparison with NaN is false, so a check would pass whatever it read."""
    lo, hi = entry.get("min"), entry.get("max")
    kind = "an integer" if entry["type"] == "int" else "a number"
    if _TYPES["number"](value) and not math.isfinite(value):
        return f"expected {kind}, not {value!r}"
    if value is None or not _TYPES["number"](value) or ((lo is None or value >= lo) and (hi is None or value <= hi)):
        return None
    if lo is not None and hi is not None:
        return f"expected {kind} from {lo} to {hi}"
    return f"expected {kind} of at least {lo}" if lo is not None else f"expected {kind} of at most {hi}"


def load_all(profile_dir: Path | None = None, site_dir: Path | str | None = None) -> dict[str, dict]:
    """Every profile by name, the site's first (site_profiles()), then the shipped ones of `profile_dir`."""
    profile_dir = Path(profile_dir) if profile_dir else default_profile_dir()
    profiles = {}
    for doc in site_profiles(site_dir):
        if doc["name"] in profiles:
            raise ProfileError(
                f"profile files {profiles[doc['name']]['path']} and {doc['path']} are both named "
                f"{doc['name']!r}; expected one profile of each name in {SITE_VARIABLE}"
            )
        profiles[doc["name"]] = doc
    for path in sorted(profile_dir.glob("*.yml")):
        doc = _load_file(path)
        profiles.setdefault(doc["name"], doc)  # a site profile of the same name stands instead
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
                raise ProfileError(
                    f"profile file {profiles[GENERIC]['path']}: threshold '{key}' {bound} = {entry[bound]!r}; "
                    "expected a number, on an int or number threshold only"
                )
    for name, doc in profiles.items():
        for key, entry in doc["thresholds"].items():
            if key not in base:
                raise ProfileError(
                    f"profile file {doc['path']}: unknown threshold '{key}';{did_you_mean(key, base) or ' ' + UNKNOWN_KEY}"
                )
            if not _type_ok(base[key]["type"], entry["value"]):
                raise ProfileError(
                    f"profile file {doc['path']}: threshold '{key}' = {entry['value']!r}; expected {base[key]['type']} or null"
                )
            why = _bounds_problem(base[key], entry["value"])
            if why:
                raise ProfileError(
                    f"profile file {doc['path']}: threshold '{key}' = {entry['value']!r}; {why} (or null)"
                )
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
    site_dir: Path | str | None = None,
    gpus: int | None = None,
) -> dict:
    """The effective profile: generic <- model profile <- inventory overrides. `site_dir`: the site's profiles from
    that folder rather than from the environment (site_profiles()), as the controller checks a node's. `gpus`: the
    node's GPU count, whose topology's calibrated limits apply (calibration.topology_of).

    Returns {"name", "matched", "note", "thresholds": {key: {"value", "source"}}, "calibration"}; a relative
    limit's entry also says whether it is `calibrated` and its per-metric values (`by_metric`, calibration.py).
    """
    profiles = load_all(profile_dir, site_dir)
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
    thresholds, calibrated = calibration.apply(thresholds, name, profiles[name]["path"], calibration.topology_of(gpus))
    for key, value in (overrides or {}).items():
        if key not in thresholds:
            raise ProfileError(
                f"gpufleet_thresholds.{key} is not a known threshold;{did_you_mean(key, thresholds) or ' ' + UNKNOWN_KEY}"
            )
        kind = profiles[GENERIC]["thresholds"][key]["type"]
        if not _type_ok(kind, value):
            raise ProfileError(f"gpufleet_thresholds.{key} = {value!r} has the wrong type; expected {kind} or null")
        why = _bounds_problem(profiles[GENERIC]["thresholds"][key], value)
        if why:
            raise ProfileError(f"gpufleet_thresholds.{key} = {value!r} is out of bounds; {why} (or null)")
        if isinstance(value, list) and any(_TYPES["number"](v) and not math.isfinite(v) for v in value):
            raise ProfileError(f"gpufleet_thresholds.{key} = {value!r} holds a number that is not finite")
        thresholds[key] = {"value": value, "source": "inventory override (gpufleet_thresholds)"}
    return {
        "name": name,
        "matched": name != GENERIC or profile_name == GENERIC,
        "note": note,
        "path": profiles[name]["path"],
        "thresholds": thresholds,
        **({"uncalibrated": profiles[name]["uncalibrated"]} if profiles[name].get("uncalibrated") else {}),
        "calibration": calibrated,
    }


def value(profile: dict, key: str) -> Any:
    return profile["thresholds"][key]["value"]


def threshold(profile: dict, key: str, **extra: Any) -> dict:
    """A result's `threshold` field: the key, its value and its source."""
    entry = profile["thresholds"][key]
    return {"key": key, "value": entry["value"], "source": entry["source"], **extra}
