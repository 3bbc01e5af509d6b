"""The pictures of report.html as report.md writes them, small tables a terminal shows whole: each GPU beside its
siblings and its past, the soak window by window (every window of every GPU: its figures and what the sampler saw,
every foreign process), NCCL's busbw beside the baseline's; and each GPU's papers (serials, firmware, ECC, remapped
rows). Also the Markdown escaping report.md uses everywhere (inline, prose, code)."""

from __future__ import annotations

import re
from typing import Any

from gpufleet.base.schema import size_text
from gpufleet.comparisons import figure_text
from gpufleet.report import chart_data, inventory, soak_data
from gpufleet.report.formatting import fmt_scalar


def inline(text: Any) -> str:
    """One line of text that cannot open an HTML tag or break a table."""
    s = " ".join(str(text).split())
    return s.replace("\\", "\\\\").replace("|", "\\|").replace("<", "\\<")


def prose(text: Any) -> str:
    """_inline, and nothing in it read as Markdown: no link, image or emphasis (a profile's `source` is free text,
    and the document that carries it may be anyone's)."""
    return re.sub(r"([\[\]()*_`~!#&])", r"\\\1", inline(text))


def code(text: Any) -> str:
    """A code span that holds any text: its fence is longer than any run of backticks inside, and a pipe is
    escaped so that it cannot end a table cell (GFM drops the backslash inside the span)."""
    s = " ".join(str(text).split()).replace("|", "\\|")
    fence = "`" * (max(map(len, re.findall("`+", s)), default=0) + 1)
    pad = " " if s[:1] == "`" or s[-1:] == "`" else ""
    return f"{fence}{pad}{s}{pad}{fence}"


def busbw_tables(node: dict, report: dict) -> list[str]:
    """busbw in GB/s, one row per message size, one column per collective, then the baseline's figures beside this
    run's; report.html draws the same."""
    charts = chart_data.nccl_charts(node, report)
    if not charts:
        return []
    lines = ["### NCCL bus bandwidth (GB/s)", ""]
    for chart in charts:
        note = "; on the CPU: a logic check, not a performance figure" if chart.get("backend") == "gloo" else ""
        lines += [f"{inline(chart['title'])}{inline(note)}:", ""]
        sizes = sorted({size for line in chart["lines"] for size, _ in line["points"]})
        by_line = [dict(line["points"]) for line in chart["lines"]]
        lines.append("| size | " + " | ".join(inline(line["label"]) for line in chart["lines"]) + " |")
        lines.append("| ---: | " + " | ".join("---:" for _ in chart["lines"]) + " |")
        for size in sizes:
            cells = [inline(fmt_scalar(points[size])) if size in points else "" for points in by_line]
            lines.append(f"| {inline(size_text(size))} | " + " | ".join(cells) + " |")
        lines.append("")
        if chart.get("baseline_run"):
            lines += [
                f"Against baseline run {inline(chart['baseline_run'])}, at the largest size of each size band:",
                "",
                "| collective | size | this run | baseline | change |",
                "| --- | ---: | ---: | ---: | ---: |",
            ]
            for line, points in zip(chart["lines"], by_line):
                for size, base in line["baseline"]:
                    now = points.get(size)
                    change = f"{(now - base) / base * 100:+.1f}%" if now is not None and base else ""
                    lines.append(
                        f"| {inline(line['label'])} | {inline(size_text(size))} | "
                        f"{inline(fmt_scalar(now)) if now is not None else ''} | {inline(fmt_scalar(base))} | {change} |"
                    )
            lines.append("")
    return lines


def _pct(v) -> str:
    return f"{v:+.1f}%" if isinstance(v, (int, float)) else ""


def gpu_tables(node: dict) -> list[str]:
    """Each GPU beside its siblings and its past, one table per figure: what report.html draws as bars."""
    lines = []
    for panel in chart_data.gpu_bars(node["results"], node.get("per_gpu")):
        limits = []
        if panel["sibling_limit"] is not None:
            limits.append(
                f"siblings' limit {fmt_scalar(panel['sibling_limit_pct'])}% under what each GPU is held against "
                f"(lowest passing {figure_text(panel['sibling_limit'])})"
            )
        if panel["floor"] is not None:
            limits.append(f"floor {panel['floor_key']} {figure_text(panel['floor'])}")
        lines += [
            f"### {inline(panel['label'])} per GPU ({inline(panel['unit'])})",
            "",
            *([inline("; ".join(limits)) + ".", ""] if limits else []),
            "| GPU | figure | status | held against | against it | usual place | baseline run | against baseline |",
            "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: |",
        ]
        for g in panel["gpus"]:
            base = g["baseline"]
            lines.append(
                f"| {inline(g['gpu'])} | {figure_text(g['value'])} | {inline(g['status'])} | "
                f"{figure_text(g['reference']) if g['reference'] is not None else ''} | {_pct(g['deviation_pct'])} | "
                f"{figure_text(g['usual']) if g['usual'] is not None else ''} | "
                f"{figure_text(base) if base is not None else ''} | "
                f"{_pct((g['value'] - base) / base * 100) if base else ''} |"
            )
        lines.append("")
    return lines


def soak_tables(node: dict) -> list[str]:
    """The soak: per GPU and figure its best windows, its lowest window, the limit, the windows below it, kept apart
    and measured again; then every window of every GPU (figures, temperature, power, SM clock, clock-event reasons,
    how it was judged); every foreign process's span (on a GPU or the host's CPUs); the stretches not measured."""
    lines = []
    for t in soak_data.soak_timelines(node["results"]):
        lines += [
            f"### Soak: {inline(t['title'])} ({t.get('n_windows')} window(s) of {fmt_scalar(t['window_s'])} s)",
            "",
            f"Each window against the median of the GPU's best windows, limit {fmt_scalar(t['limit_pct'])}% under it.",
            "",
            "| GPU | figure | windows | best windows | lowest window | limit | below the limit | disturbed (left out) "
            "| measured again |",
            "| --- | --- | ---: | ---: | --- | ---: | --- | --- | --- |",
        ]
        for lane in t["lanes"]:
            shown = [w for w in lane["windows"] if w["value"] is not None]
            low = min(shown, key=lambda w: w["value"]) if shown else None
            lowest = (
                f"{figure_text(low['value'])} (window {low['index']}, at {fmt_scalar(low['start_s'])} s)" if low else ""
            )
            lines.append(
                f"| {inline(lane['gpu'])} | {inline(lane['label'])} ({inline(lane['unit'])}) | {len(lane['windows'])} | "
                f"{figure_text(lane['best']) if lane['best'] is not None else ''} | {inline(lowest)} | "
                f"{figure_text(lane['limit']) if lane['limit'] is not None else ''} | "
                f"{inline(', '.join(str(w['index']) for w in lane['windows'] if w['below'])) or 'none'} | "
                f"{inline(', '.join(str(w['index']) for w in lane['windows'] if w['disturbed'])) or 'none'} | "
                f"{inline(', '.join(str(w['index']) for w in lane['windows'] if w['remeasured'])) or 'none'} |"
            )
        lines.append("")
        lines += _windows_table(t)
        if t["foreign"]:
            lines += [
                "Every foreign process the soak's steps saw:",
                "",
                "| foreign process | where | from | to | memory |",
                "| --- | --- | ---: | ---: | ---: |",
            ]
            for p in t["foreign"]:
                where = "host CPUs" if p["kind"] == "host_cpu" else f"GPU {p.get('index')}"
                memory = f"{fmt_scalar(p['used_memory_mib'])} MiB" if p.get("used_memory_mib") is not None else ""
                lines.append(
                    f"| {inline(p['label'])} | {where} | {fmt_scalar(p['first_s'])} s | {fmt_scalar(p['last_s'])} s | "
                    f"{memory} |"
                )
            lines.append("")
        if t["gaps"]:
            gaps = "; ".join(f"{fmt_scalar(a)} s to {fmt_scalar(b)} s" for a, b in t["gaps"])
            lines += [f"Not measured (no window): {inline(gaps)}.", ""]
    return lines


def _how(w: dict, unit: str) -> str:
    kept = w.get("disturbed_value")
    left = f" (measured {figure_text(kept)} {unit}, left out)" if isinstance(kept, (int, float)) else ""
    if w["disturbed"]:
        return "disturbed" + left
    if w["slowed"]:
        return "slowed with nothing seen, measured again" + left
    return "; ".join(x for x, on in (("measured again", w["remeasured"]), ("below the limit", w["below"])) if on)


def _windows_table(t: dict) -> list[str]:
    """Every window of every GPU: its figures, what the sampler saw, and how it was judged."""
    tel = {(g["index"], w["index"]): w for g in t["telemetry"] for w in g["windows"]}
    figures: dict = {}
    for lane in t["lanes"]:
        for w in lane["windows"]:
            row = figures.setdefault((w["index"], lane["index"]), {"start_s": w["start_s"], "how": []})
            row[lane["metric"]] = w["value"]
            how = _how(w, lane["unit"])
            if how:
                row["how"].append(f"{lane['label']}: {how}" if how not in row["how"] else how)
    for key in tel:
        figures.setdefault((key[1], key[0]), {"start_s": tel[key]["start_s"], "how": []})
    if not figures:
        return []
    lines = [
        "Every window:",
        "",
        "| window | from | GPU | bf16 matmul (TFLOPS) | HBM copy (GB/s) | all_reduce (GB/s) | hottest (°C) "
        "| power median / highest (W) | SM clock median / lowest (MHz) | clock-event reasons | judged |",
        "| ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |",
    ]

    def fig(v) -> str:
        return figure_text(v) if isinstance(v, (int, float)) else ""

    order = sorted(figures, key=lambda k: (figures[k]["start_s"] or 0.0, k[0], k[1] is None, k[1] or 0))
    for window, gpu in order:
        row, w = figures[(window, gpu)], tel.get((gpu, window)) or {}
        lines.append(
            f"| {window} | {fmt_scalar(row['start_s'])} s | {'all GPUs' if gpu is None else f'GPU {gpu}'} | "
            f"{fig(row.get('matmul_tflops'))} | {fig(row.get('hbm_gbps'))} | {fig(row.get('busbw_gbps'))} | "
            f"{fig(w.get('temperature_max_c'))} | "
            + (f"{fig(w.get('power_median_w'))} / {fig(w.get('power_max_w'))}" if w else "")
            + " | "
            + (f"{fig(w.get('sm_clock_median_mhz'))} / {fig(w.get('sm_clock_min_mhz'))}" if w else "")
            + f" | {inline(', '.join(w.get('reasons') or [])) if w else ''} | {inline('; '.join(row['how']))} |"
        )
    limits = [
        f"GPU {g['index']}: "
        + "; ".join(
            [f"power limit {fig(g['power_limit_w'])} W"] * (g["power_limit_w"] is not None)
            + [f"slowdown {fig(g['slowdown_c'])} °C"] * (g["slowdown_c"] is not None)
            + [f"{r} {fmt_scalar(sec)} s of {fmt_scalar(g['ran_s'])} s" for r, sec in g["throttle"].items() if sec]
            or ["no clock-event reason"]
        )
        for g in t["telemetry"]
    ]
    return lines + [""] + ([inline("; ".join(limits)) + ".", ""] if limits else [])


def inventory_table(node: dict) -> list[str]:
    """Each GPU's papers: what an RMA desk asks for (inventory.gpu_rows)."""
    rows = inventory.gpu_rows(node)
    if not rows:
        return []
    lines = [
        "### GPUs",
        "",
        "| " + " | ".join(title for _, title in inventory.COLUMNS) + " |",
        "| " + " | ".join("---" for _ in inventory.COLUMNS) + " |",
    ]
    for r in rows:
        lines.append("| " + " | ".join(inline("" if r[k] is None else r[k]) for k, _ in inventory.COLUMNS) + " |")
    return lines + [""]
