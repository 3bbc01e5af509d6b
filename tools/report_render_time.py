#!/usr/bin/env python3
"""How long a browser takes to draw the report of a fleet of 1,000 nodes (docs/results/*-cpu-report-render/).

The report is tests/report_runs.py's synthetic fleet (the one tests/test_report_browser.py checks), built once into
a temporary folder; headless Chromium (tests/chromium.py, Debian's `chromium`) then opens its report.html --runs
times in a window 1,400 pixels wide. Each run's figure is the time from navigation to the first frame drawn after
the load event (performance.now() in the page, two animation frames after the load). The target: 2 s at the most,
held when every run is under it.

    .venv/bin/python tools/report_render_time.py --runs 10 --out DIR/render.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests")]

import chromium  # noqa: E402
import report_runs  # noqa: E402

NODES = 1000
WIDTH = 1400
TARGET_S = 2.0
FIRST_FRAME = "new Promise(done => requestAnimationFrame(() => requestAnimationFrame(() => done(performance.now()))))"


def measure(binary: str, runs: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="report-render-") as tmp:
        page = report_runs.fleet(Path(tmp) / "reports", NODES) / "report.html"
        browser = chromium.Browser(binary, Path(tmp))
        try:
            first_frame_s = []
            for _ in range(runs):
                browser.open(page, WIDTH)
                first_frame_s.append(round(browser.evaluate(FIRST_FRAME, await_promise=True) / 1000, 3))
            version = browser.call("Browser.getVersion")["product"]
        finally:
            browser.close()
        size_bytes = page.stat().st_size
    return {
        "nodes": NODES,
        "bytes": size_bytes,
        "browser": version,
        "runs": runs,
        "first_frame_s": first_frame_s,
        "median_s": round(statistics.median(first_frame_s), 3),
        "max_s": max(first_frame_s),
        "target_s": TARGET_S,
        "held": max(first_frame_s) < TARGET_S,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=10, help="how many times the report is opened (default 10)")
    ap.add_argument("--out", type=Path, help="write the figures to this JSON file")
    args = ap.parse_args(argv)
    if args.runs < 1:
        ap.error(f"--runs: expected a whole number of 1 or more, got {args.runs}")
    binary = chromium.find()
    if binary is None:
        print(
            "report_render_time: chromium is not installed (Debian's package chromium: scripts/system-deps.sh test)",
            file=sys.stderr,
        )
        return 2
    figures = measure(binary, args.runs)
    print(f"{figures['browser']}, report.html {figures['bytes']:,} bytes")
    print("| nodes | runs | median s | max s | target s | held |")
    print("| ---: | ---: | ---: | ---: | ---: | --- |")
    print(
        f"| {figures['nodes']} | {figures['runs']} | {figures['median_s']:.3f} | {figures['max_s']:.3f} "
        f"| {figures['target_s']:g} | {'yes' if figures['held'] else 'no'} |"
    )
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(figures, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
