"""junit.xml: one <testsuite> per node (its name the node's), one <testcase> per check ("<group>.<check>"),
classname "gpufleet.<node, dots as underscores>".

fail  -> <failure message=reason type=class>, body: class, value (trust), threshold, remedy, detail JSON
error -> <error message=reason type=class>, same body
(class: hardware, environment, configuration or software, gpufleet.base.failure_class)
skip  -> <skipped message=reason>
warn  -> passes, with the reason and remedy in <system-out>
"""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from typing import Any

from gpufleet.base.registry import registers
from gpufleet.base import schema
from gpufleet.report.formatting import check_id, class_text, threshold_text, trust_text, value_text

# Characters XML 1.0 cannot hold at all (control bytes from a log tail, say).
_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def _x(text: Any) -> str:
    return _NOT_XML.sub("\ufffd", str(text))


def _seconds(v: Any) -> float:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and v == v and v >= 0 else 0.0


def _body(res: dict) -> str:
    lines = [f"class: {class_text(res)}"] if class_text(res) else []
    if value_text(res):
        lines.append(f"value: {value_text(res)}" + (f" (trust: {trust_text(res)})" if trust_text(res) else ""))
    elif trust_text(res):
        lines.append(f"trust: {trust_text(res)}")
    bound, source = threshold_text(res.get("threshold"))
    if bound:
        lines.append(f"threshold: {bound}" + (f" (source: {source})" if source else ""))
    lines.append(f"reason: {res.get('reason') or '(no reason given)'}")
    if res.get("remedy"):
        lines.append(f"remedy: {res['remedy']}")
    if res.get("detail"):
        lines.append("detail: " + json.dumps(res["detail"], indent=1, sort_keys=True, default=str))
    return _x("\n".join(lines))


def classname(host: str) -> str:
    """gpufleet.<host> with the host's dots as underscores: Jenkins and GitLab split a classname into packages at
    every dot, so that an FQDN would become a tree; this keeps one package (gpufleet) and one class per node."""
    return "gpufleet." + str(host).replace(".", "_")


def _testcase(suite: ET.Element, host: str, res: dict) -> None:
    case = ET.SubElement(
        suite,
        "testcase",
        name=_x(check_id(res)),
        classname=_x(classname(host)),
        time=f"{_seconds(res.get('seconds')):.3f}",
    )
    status, reason = res["status"], _x(res.get("reason") or "")
    if status == schema.FAIL:
        ET.SubElement(case, "failure", message=reason, type=_x(class_text(res))).text = _body(res)
    elif status == schema.ERROR:
        ET.SubElement(case, "error", message=reason, type=_x(class_text(res))).text = _body(res)
    elif status == schema.SKIP:
        ET.SubElement(case, "skipped", message=reason)
    elif status in (schema.WARN, schema.INFO):  # neither fails the suite; the report tells a warning from information
        ET.SubElement(case, "system-out").text = f"{status.upper()} " + _body(res)


@registers("output.junit", "render")
def render(report: dict) -> str:
    root = ET.Element("testsuites", name=_x(f"gpufleet {report['run_id']}"))
    totals = dict.fromkeys(("tests", "failures", "errors", "skipped"), 0)
    total_time = 0.0
    for host, node in report["nodes"].items():
        c = node["counts"]
        stats = {
            "tests": len(node["results"]),
            "failures": c[schema.FAIL],
            "errors": c[schema.ERROR],
            "skipped": c[schema.SKIP],
        }
        node_time = sum(_seconds(r.get("seconds")) for r in node["results"])
        suite = ET.SubElement(
            root,
            "testsuite",
            name=_x(host),
            timestamp=_x(node.get("started") or report["generated"]),
            time=f"{node_time:.3f}",
            **{k: str(v) for k, v in stats.items()},
        )
        props = ET.SubElement(suite, "properties")
        facts = {"verdict": node["verdict"], "profile": node.get("profile"), "source": node.get("source")}
        # Per GPU, per HCA and the net plugin's path and hash are lists and mappings: written as JSON.
        facts.update(
            {
                f"version.{k}": json.dumps(v, sort_keys=True) if isinstance(v, (dict, list)) else v
                for k, v in (node.get("versions") or {}).items()
            }
        )
        for name, value in facts.items():
            if value is not None:
                ET.SubElement(props, "property", name=_x(name), value=_x(value))
        for res in node["results"]:
            _testcase(suite, host, res)
        for k in totals:
            totals[k] += stats[k]
        total_time += node_time
    for k, v in totals.items():
        root.set(k, str(v))
    root.set("time", f"{total_time:.3f}")
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"
