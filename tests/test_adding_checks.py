"""docs/adding-checks.md stays true: its snippets, applied as written to a copy of the repository, give a check, a
benchmark and an output format that run (the check on a recorded node, the benchmark on this machine's CPU in the
node stage of its run tier, the output in a real report), touching no more places than the guide says: nothing
Ansible lists is to be generated again, and no other file names them; `make generate` writes their rows of
docs/checks.md from the declarations and the docstrings. With all of them applied and `make generate` run, as the
guide says, the whole fast suite (`make test-fast`, ruff's check and format among it) passes on the copy: no test
the guide does not name lists what it adds by hand."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import waiting

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "adding-checks.md"
# The places each change may touch, as the guide's headings promise.
# A file the guide creates in a folder it creates counts once, as that folder.
MOST_PLACES = {"check": 2, "benchmark": 2, "output": 3}
# <!-- guide: CHANGE append|create FILE -->  or  <!-- guide: CHANGE after "ANCHOR" FILE -->, then a fenced block.
DIRECTIVE = re.compile(
    r'<!-- guide: (\w+) (append|create|after "((?:[^"\\]|\\.)*)") (\S+) -->\n```\w*\n(.*?)```', re.DOTALL
)


def snippets() -> list[dict]:
    return [
        {
            "change": m[1],
            "how": m[2].split(" ")[0],
            "anchor": m[3] and m[3].replace('\\"', '"'),
            "file": m[4],
            "text": m[5],
        }
        for m in DIRECTIVE.finditer(GUIDE.read_text())
    ]


def apply(root: Path, snippet: dict) -> None:
    path = root / snippet["file"]
    if snippet["how"] == "create":
        assert not path.exists(), f"the guide creates {snippet['file']}, which exists"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(snippet["text"])
    elif snippet["how"] == "append":
        path.write_text(path.read_text().rstrip("\n") + "\n\n\n" + snippet["text"])
    else:
        lines = path.read_text().splitlines(keepends=True)
        at = [i for i, line in enumerate(lines) if line.strip().startswith(snippet["anchor"])]
        assert len(at) == 1, f"the guide's anchor {snippet['anchor']!r} is in {len(at)} lines of {snippet['file']}"
        lines.insert(at[0] + 1, snippet["text"])
        path.write_text("".join(lines))


def copy_checkout(root: Path) -> None:
    """The files of this checkout that git tracks, and those it does not ignore, as they are now, copied to `root`
    (a link as a link: the collection's path and the profiles' point into the copy)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    for name in filter(None, listed.split("\0")):
        source, target = ROOT / name, root / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_symlink():
            target.symlink_to(os.readlink(source))
        elif source.is_file():  # a file deleted and not yet committed is not there
            shutil.copy2(source, target)


def applied_copy(root: Path) -> Path:
    copy_checkout(root)
    for snippet in snippets():
        apply(root, snippet)
    return root


# What `generate.py --check` said of each applied copy before `make generate`'s script ran on it.
STALE: dict[Path, subprocess.CompletedProcess] = {}


@pytest.fixture(scope="module")
def applied(tmp_path_factory):
    """A copy of the checkout with every snippet of the guide applied, then `make generate`'s script run, as the
    guide says (it writes the node's index of the benchmarks' folders)."""
    root = applied_copy(tmp_path_factory.mktemp("guide"))
    STALE[root] = generate(root, "--check")
    assert generate(root).returncode == 0
    return root


def run_engine(root: Path, code: str, tmp_path: Path) -> dict:
    # The applied checkout's own profiles, not the copy the other tests judge with (conftest.generic_limits).
    env = {k: v for k, v in os.environ.items() if k != "GPUFLEET_PROFILE_DIR"} | {
        "PYTHONPATH": str(root / "src"),
        "CUDA_VISIBLE_DEVICES": "",
    }
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.splitlines()[-1])


def place(snippet: dict) -> str:
    """The file a snippet changes, or the new folder it creates the file in."""
    folder = Path(snippet["file"]).parent
    return str(folder) if snippet["how"] == "create" and not (ROOT / folder).exists() else snippet["file"]


def test_the_guide_touches_no_more_places_than_it_says():
    found = snippets()
    places = {change: {place(s) for s in found if s["change"] == change} for change in MOST_PLACES}
    assert set(s["change"] for s in found) == set(MOST_PLACES), "a snippet of the guide names an unknown change"
    for change, most in MOST_PLACES.items():
        assert 0 < len(places[change]) <= most, (change, places[change])
    text = GUIDE.read_text()
    assert "## A check: one function and one declaration" in text
    assert "## A benchmark: one folder and one line" in text and "## An output format: three places" in text


def generate(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(root / "tools" / "generate.py"), *args], capture_output=True, text=True, timeout=120
    )


def test_make_generate_writes_the_new_rows_of_checks_md_and_nothing_ansible_lists(applied):
    stale = STALE[applied]
    said = stale.stderr.strip()
    assert stale.returncode == 1 and said.endswith(
        "(run `make generate`): docs/checks.md, docs/faults.md, src/gpufleet/benchmarks/node_index.py"
    ), stale
    assert generate(applied, "--check").returncode == 0
    # The guide's new report output joins the file-fault matrix by itself (base/layout.py takes every output).
    faults = (applied / "docs" / "faults.md").read_text().splitlines()
    assert "| `report.csv` | run folder, text | 9 | `report` makes |" in faults
    lines = (applied / "docs" / "checks.md").read_text().splitlines()
    (check,) = [line for line in lines if line.startswith("| `host_hygiene.kernel_release` |")]
    said = "The kernel the node runs, as read (host.kernel): what a fleet compares after a re-image."
    assert check.endswith(f"| {said} |"), check
    (bench,) = [line for line in lines if "| `benchmark.host_copy_bandwidth` |" in line]
    assert bench.endswith("| `host_copy_gbps_min` | host memory copy bandwidth. |"), bench


def test_the_guides_check_runs_in_its_group_with_its_class(applied, tmp_path):
    readings = ROOT / "tests" / "data" / "readings" / "recorded-h100-x1-vm.json"
    out = run_engine(
        applied,
        f"""
import json
from gpufleet.base import failure_class, schema
from gpufleet.node import host_documents
readings = json.load(open({str(readings)!r}))
doc = host_documents.check_host(readings, ["host_hygiene"], host="n0")
res = [r for r in doc["results"] if r["check"] == "kernel_release"]
del readings["host"]["kernel"]
again = host_documents.check_host(readings, ["host_hygiene"], host="n0")
missing = [r for r in again["results"] if r["check"] == "kernel_release"]
print(json.dumps({{"res": res, "missing": missing, "class": failure_class.default("kernel_release", "error")}}))
""",
        tmp_path,
    )
    assert [(r["group"], r["status"]) for r in out["res"]] == [("host_hygiene", "pass")], out
    assert out["res"][0]["value"] and out["res"][0]["reason"].startswith("kernel ")
    assert out["missing"][0]["status"] == "error" and out["missing"][0]["class"] == "software"


def test_the_guides_benchmark_runs_by_its_name_and_is_judged(applied, tmp_path):
    out = run_engine(
        applied,
        """
import json
from gpufleet.node import host_documents
from gpufleet.base import registry
doc = host_documents.bench_host(["host_copy"], depth="smoke", host="n0")
print(json.dumps({"results": doc["results"], "names": registry.benchmark_names(),
                  "acceptance": registry.tier_benchmarks("acceptance")}))
""",
        tmp_path,
    )
    assert "host_copy" in out["names"] and "host_copy" in out["acceptance"]
    (res,) = out["results"]
    assert (res["check"], res["group"], res["unit"]) == ("host_copy_bandwidth", "benchmark", "GB/s"), res
    assert res["status"] == "skip" and res["value"] > 0 and res["threshold"]["key"] == "host_copy_gbps_min", res


def test_the_guides_benchmark_runs_in_the_node_stage_of_its_tier_in_a_process_of_its_own(applied, tmp_path):
    out = run_engine(
        applied,
        f"""
import json, subprocess, sys
argv = [sys.executable, "-m", "gpufleet", "node-stage", "--part", "benchmarks", "--host", "n0", "--tier",
        "acceptance", "--benchmarks", "host_copy", "--run-id", "r1", "--lock-path", {str(tmp_path / "node.lock")!r}]
done = subprocess.run(argv, capture_output=True, text=True)
print(json.dumps({{"rc": done.returncode, "stderr": done.stderr[-2000:], "stage": json.loads(done.stdout or "{{}}")}}))
""",
        tmp_path,
    )
    assert out["rc"] == 0, out["stderr"]
    stage = out["stage"]
    assert stage["benchmarks"] == ["host_copy"] and stage["depth"] == "quick", stage
    (res,) = [r for r in stage["results"] if r["group"] == "benchmark"]
    assert res["check"] == "host_copy_bandwidth" and res["status"] == "skip", res


def test_the_guides_output_is_written_by_the_report(applied, tmp_path):
    run_dir = tmp_path / "reports" / "r1"
    (run_dir / "hosts").mkdir(parents=True)
    doc = {
        "schema_version": 1,
        "host": "n0",
        "engine_version": "0",
        "profile": None,
        "versions": {},
        "started": "2026-11-21T21:00:00Z",
        "seconds": 1.0,
        "results": [
            {
                "check": "ecc",
                "group": "gpu_health",
                "status": "pass",
                "value": 0,
                "unit": None,
                "threshold": None,
                "reason": "no ECC errors",
                "remedy": None,
                "detail": {},
                "class": None,
                "started": "2026-11-21T21:00:00Z",
                "seconds": 0.1,
            }
        ],
    }
    (run_dir / "hosts" / "n0.json").write_text(json.dumps(doc))
    out = run_engine(
        applied,
        f"""
import json
from pathlib import Path
from gpufleet import report
summary = report.build(Path({str(run_dir)!r}))
print(json.dumps(summary["files"]))
""",
        tmp_path,
    )
    assert out["csv"] == str(run_dir / "report.csv")
    lines = Path(out["csv"]).read_text().splitlines()
    assert lines[0].startswith("node,verdict,") and lines[1].startswith("n0,pass,"), lines
    assert all(Path(out[k]).is_file() for k in ("json", "md", "html", "junit"))


def copy_env(root: Path) -> dict:
    """This environment for a command in the copy: its PATH's Python (this one) imports the copy's engine, not the
    checkout's (which the environment installs in editable mode, behind PYTHONPATH), and the test run inside gets
    its own marker and profiles, not this run's."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "GPUFLEET_")) and k != waiting.MARK}
    return env | {"PYTHONPATH": str(root / "src"), "PATH": f"{root / '.venv' / 'bin'}:{os.environ['PATH']}"}


@pytest.mark.slow
def test_the_whole_fast_suite_passes_with_every_change_of_the_guide(tmp_path):
    root = applied_copy(tmp_path / "checkout")
    # The checkout's environment, under the name the Makefile uses.
    (root / ".venv").symlink_to(sys.prefix)
    env = copy_env(root)
    imported = subprocess.run(
        [sys.executable, "-c", "import gpufleet; print(gpufleet.__file__)"], env=env, capture_output=True, text=True
    )
    assert imported.stdout.startswith(str(root / "src")), imported
    # As the guide says: make generate, then the tests. `-o`: the environment is this one, installed already; make
    # must not install the copy into it.
    made = subprocess.run(["make", "generate"], cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert made.returncode == 0, made.stdout[-2000:] + made.stderr[-2000:]
    suite = subprocess.run(
        ["make", "-o", ".venv/.installed-test", "test-fast"],
        cwd=root,
        # This file is the one test left out: in the copy it would apply the guide a second time.
        env=env | {"PYTEST_ADDOPTS": "--ignore=tests/test_adding_checks.py"},
        capture_output=True,
        text=True,
        timeout=3600,
    )
    failed = [line for line in suite.stdout.splitlines() if line.startswith(("FAILED", "ERROR"))]
    assert suite.returncode == 0 and not failed, "\n".join(failed) + "\n" + suite.stdout[-3000:] + suite.stderr[-2000:]
    # pytest's summary line: make may print its own line after it (make[1]: Leaving directory, under an outer make)
    assert re.search(r"=+ \d+ passed\b", suite.stdout), suite.stdout[-2000:]
