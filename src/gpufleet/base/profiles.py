"""Threshold profiles per GPU model, picked from the detected GPU name.

`files/profiles/generic.yml` declares every threshold key with its default and
source, and bounds numbers with `min` and `max`, but those of a benchmark alone:
its declaration holds them (benchmarks/<name>/<name>_declared.py, Threshold),
merged into generic's here, a key declared twice refused naming both places. A
model profile overrides some keys; inventory overrides any key
(`gpufleet_thresholds`). Unknown keys, wrong types and numbers out of bounds (a
negative minimum, a fraction over 1) are refused with a message that names the
file or variable and the key.

A site's own profiles (validate.yml's `gpufleet_profile_dir`) come before the
shipped ones: matched first. Each extends another profile key by key: one of a
shipped profile's name extends that one (its match list too, unless it gives
its own), else the one its `extends:` names, else generic; it keeps the
calibration of the shipped profile it extends, and every threshold it leaves
unset says in its source which profile it came from.
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

from gpufleet.base import calibration, paths, registry, workload_specs
from gpufleet.base.errors import InputError, did_you_mean

GENERIC = "generic"
SITE_DIR_ENV = "GPUFLEET_SITE_PROFILE_DIR"
SITE_TEXTS_ENV = "GPUFLEET_SITE_PROFILES"
SITE_VARIABLE = "gpufleet_profile_dir"
UNKNOWN_KEY = f"expected a key of files/profiles/{GENERIC}.yml or of a benchmark's declaration (docs/inventory.md)"


class ProfileError(InputError):
    """A profile file or an override is not what was expected."""


def default_profile_dir() -> Path:
    env = os.environ.get("GPUFLEET_PROFILE_DIR")
    if env:
        return Path(env)
    # Installed beside the package (wheel) or in the source checkout.
    here = Path(__file__).resolve().parent
    for cand in (here / "profiles", here.parents[2] / "files" / "profiles"):
        if (cand / f"{GENERIC}.yml").is_file():
            return cand
    raise ProfileError(
        f"no profile directory: neither {here / 'profiles'} nor "
        f"{here.parents[2] / 'files' / 'profiles'} holds {GENERIC}.yml; "
        "set GPUFLEET_PROFILE_DIR or --profile-dir"
    )


def _load_file(path: Path) -> dict:
    text, why = paths.read_text(path, follow=True)  # never waits on a FIFO
    if text is None:
        raise ProfileError(f"profile file {path} {why}")
    return _parse(text, path)


def _parse(text: str, path: Path | str) -> dict:
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ProfileError(f"profile file {path} does not parse as YAML: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("name"), str):
        raise ProfileError(f"profile file {path}: expected a mapping with a 'name' string")
    thresholds = doc["thresholds"] = doc.get("thresholds") or {}  # a site profile may set none (its workloads alone)
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
    if not isinstance(doc.get("extends", ""), str):
        raise ProfileError(f"profile file {path}: 'extends' must name the profile this one extends, or be left out")
    why = workload_specs.problem(doc["workloads"]) if "workloads" in doc else None
    if why:
        raise ProfileError(f"profile file {path}: {why}")
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
    """Every profile by name, the site's first (site_profiles()), then the shipped ones of `profile_dir`. A site
    profile of a shipped profile's name keeps that one as `shipped` (what it extends) and takes its match list and
    `uncalibrated` where it gives none."""
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
        site = profiles.get(doc["name"])
        if site is None:
            profiles[doc["name"]] = doc
            continue
        if site.get("extends", doc["name"]) != doc["name"]:
            raise ProfileError(
                f"profile file {site['path']}: named like the shipped profile {doc['name']}, it extends that one; "
                f"leave out 'extends: {site['extends']}', or give the profile another name"
            )
        site["shipped"] = doc
        for field in ("match", "exclude", "uncalibrated"):
            if field not in site and field in doc:
                site[field] = doc[field]
    for doc in profiles.values():
        _chain(profiles, doc["name"])  # every profile extends one that exists, never itself
    if GENERIC not in profiles:
        raise ProfileError(f"profile directory {profile_dir} has no {GENERIC}.yml (the base of every profile)")
    base = profiles[GENERIC]["thresholds"]
    places = {key: f"profile file {profiles[GENERIC]['path']}" for key in base}
    for key, (place, entry) in declared_thresholds().items():
        if key in base:
            raise ProfileError(
                f"threshold '{key}' is declared twice: in {places[key]} and in {place}; expected it in one of them"
            )
        base[key], places[key] = entry, place
    for key, entry in base.items():
        if entry.get("type") not in _TYPES:
            raise ProfileError(f"{places[key]}: threshold '{key}' needs a 'type', one of {', '.join(_TYPES)}")
        for bound in ("min", "max"):
            if bound in entry and not (entry["type"] in ("int", "number") and _TYPES["number"](entry[bound])):
                raise ProfileError(
                    f"{places[key]}: threshold '{key}' {bound} = {entry[bound]!r}; "
                    "expected a number, on an int or number threshold only"
                )
        ok = _type_ok(entry["type"], entry["value"])
        why = _bounds_problem(entry, entry["value"]) if ok else f"expected {entry['type']} or null"
        if why:
            raise ProfileError(f"{places[key]}: threshold '{key}' has the default {entry['value']!r}; {why}")
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


def declared_thresholds() -> dict[str, tuple[str, dict]]:
    """The profile keys the benchmarks declare (registry.Benchmark.thresholds): key -> (where it is declared, its
    entry as generic.yml would hold it). A key two benchmarks declare is refused naming both."""
    out: dict[str, tuple[str, dict]] = {}
    for b in registry.BENCHMARKS:
        place = f"benchmark {b.name}'s declaration (benchmarks/{b.name}/{b.name}_declared.py)"
        for t in b.thresholds:
            if t.key in out:
                raise ProfileError(
                    f"threshold '{t.key}' is declared twice: in {out[t.key][0]} and in {place}; expected it in one of them"
                )
            out[t.key] = (place, t.entry())
    return out


def _chain(profiles: dict[str, dict], name: str) -> list[dict]:
    """The profile `name` and those it extends, nearest first, up to (not with) generic."""
    chain, doc = [], profiles[name]
    while doc["name"] != GENERIC or doc.get("site"):
        if any(doc is seen for seen in chain):
            raise ProfileError(
                f"profile file {doc['path']}: 'extends' goes round in a circle "
                f"({' -> '.join(d['name'] for d in chain)} -> {doc['name']}); expected it to end at a shipped profile"
            )
        chain.append(doc)
        base = doc.get("shipped") or doc.get("extends") or GENERIC
        if isinstance(base, str) and base not in profiles:
            raise ProfileError(
                f"profile file {doc['path']}: extends {base!r}, which is no profile;{did_you_mean(base, profiles)}"
                f" expected one of {', '.join(sorted(profiles))}"
            )
        doc = base if isinstance(base, dict) else profiles[base]
    return chain


def _entries(doc: dict) -> dict:
    """A profile's thresholds as the effective profile holds them, each with the profile it came from."""
    return {k: {"value": e["value"], "source": e["source"], "from": doc} for k, e in doc["thresholds"].items()}


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
                f"gpufleet_profile = {profile_name!r} is not a known profile;{did_you_mean(profile_name, profiles)} "
                f"expected one of {', '.join(sorted(profiles))}"
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
    # generic <- the shipped profiles of the chain <- their calibration <- the site's profiles, each farthest first
    # (a site profile extends a site or a shipped one, a shipped one no site one).
    chain = _chain(profiles, name)
    shipped = [doc for doc in reversed(chain) if not doc.get("site")]
    thresholds = {}
    for doc in [profiles[GENERIC], *shipped]:
        thresholds.update(_entries(doc))
    # The model's measured healthy spread sets its relative limits per metric, also under a site profile that
    # extends it; a site profile's own value, and an inventory override, still win.
    base = shipped[-1] if shipped else profiles[GENERIC]
    thresholds, calibrated = calibration.apply(thresholds, base["name"], base["path"], calibration.topology_of(gpus))
    for doc in reversed(chain):
        if doc.get("site"):
            thresholds.update(_entries(doc))
    for entry in thresholds.values():
        origin = entry.pop("from")
        if profiles[name].get("site") and origin is not profiles[name]:
            kind = "site" if origin.get("site") else "shipped"
            entry["source"] = (
                f"{entry['source']} (from the {kind} profile {origin['name']}; the site's {name} leaves it unset)"
            )
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
        **({"extends": [doc["name"] for doc in chain[1:]] + [GENERIC]} if profiles[name].get("site") else {}),
        "thresholds": thresholds,
        **({"uncalibrated": profiles[name]["uncalibrated"]} if profiles[name].get("uncalibrated") else {}),
        "calibration": calibrated,
        # A site's own workloads (workload_specs.py): those of the nearest profile of the chain that declares any.
        "workloads": next((doc["workloads"] for doc in chain if "workloads" in doc), []),
    }


def value(profile: dict, key: str) -> Any:
    return profile["thresholds"][key]["value"]


def threshold(profile: dict, key: str, **extra: Any) -> dict:
    """A result's `threshold` field: the key, its value and its source."""
    entry = profile["thresholds"][key]
    return {"key": key, "value": entry["value"], "source": entry["source"], **extra}
