"""Why a torchrun fine-tune ended badly, read from torchrun's log and the workers' error files.

torchrun prints a "Root Cause (first observed failure)" block naming the rank, host, exit code and error
file of the first worker that died (the worker's main is wrapped in torch's @record, so the error file
holds its exception). A rendezvous that never completes fails in torchrun itself, before any worker:
the master waits for the other nodes' agents, the others dial the master.
"""

from __future__ import annotations

import json
import re
import signal
from pathlib import Path

_STORE_TIMEOUT = re.compile(r"Timed out after (\d+) seconds waiting for clients\. (\d+)/(\d+) clients joined")
_CONNECT = re.compile(r"DistNetworkError: (.*?(?:trying to connect to|connect to) \(([^,]+), (\d+)\).*)")
_FIELD = re.compile(r"^\s*(time|host|rank|exitcode|error_file)\s*:\s*(.*?)\s*$")
_EXC_LINE = re.compile(
    r"^\s*(?:\[rank\d+\]:\s*)?((?:[A-Za-z_][\w.]*\.)?[A-Za-z_]\w*(?:Error|Exception|Interrupt)\b:?.*)$"
)
# A rank whose peer went away: gloo names the peer's address ("Read error [10.0.0.2]:41364: Connection reset by
# peer", "Connection closed by peer [10.0.0.2]:41364"); NCCL only says a remote process or the network failed.
_GLOO_PEER = re.compile(
    r"(?:Read error|Write error|Connection closed by peer|Connection reset by peer)\s*\[([^\]]+)\]:(\d+)"
    r"(?::\s*([^.]+))?"
)
_NCCL_PEER = re.compile(r"ncclRemoteError|remote process exited or there was a network error")
# What native code printed as it aborted a rank (SIGABRT): C++'s terminate, or Python's fatal error.
_ABORT_LINE = re.compile(r"^(?:\[rank\d+\]:\s*)?(terminate called .*|Fatal Python error: .*)$", re.MULTILINE)


def _killed_by(code: int, log: str) -> str:
    """'killed by SIGKILL (...)' for a rank's negative exit code, with what the log says of it."""
    try:
        name = signal.Signals(code).name
    except ValueError:  # a number with no name here
        return f"killed by signal {code}"
    if code == signal.SIGKILL:
        return f"killed by {name} (signal {code}; often the host running out of memory)"
    if code == signal.SIGABRT:
        lines = _ABORT_LINE.findall(log)
        return f"aborted by {name} (signal {code})" + (f": {'; '.join(dict.fromkeys(lines))}" if lines else "")
    return f"killed by {name} (signal {code})"


def peer_lost(message: str | None) -> dict | None:
    """{"peer_addr", "peer_port", "what"} when `message` says the rank lost a peer (its node died or the network
    failed) rather than failing by itself; None otherwise. NCCL gives no address: peer_addr is None."""
    if not message:
        return None
    m = _GLOO_PEER.search(message)
    if m:
        what = (m.group(3) or "").strip() or (
            "connection closed by peer" if "closed" in m.group(0) else "connection lost"
        )
        return {"peer_addr": m.group(1), "peer_port": int(m.group(2)), "what": what}
    if _NCCL_PEER.search(message):
        return {"peer_addr": None, "peer_port": None, "what": "NCCL: a remote process exited or the network failed"}
    return None


def root_cause(log: str) -> dict:
    """The fields of torchrun's first-failure block, or {} when the log has none."""
    if "Root Cause (first observed failure)" not in log:
        return {}
    block = log.split("Root Cause (first observed failure)", 1)[1]
    out, tb = {}, []
    in_tb = False
    for line in block.splitlines()[1:]:
        if line.startswith("====="):
            break
        m = _FIELD.match(line)
        if m and not in_tb:
            out[m.group(1)] = m.group(2)
        elif line.strip().startswith("traceback :"):
            in_tb = True
            tb.append(line.split("traceback :", 1)[1].strip())
        elif in_tb:
            tb.append(line.strip())
    rank = re.match(r"(\d+)\s*\(local_rank:\s*(\d+)\)", out.get("rank", ""))
    if rank:
        out["rank"], out["local_rank"] = int(rank.group(1)), int(rank.group(2))
    code = re.match(r"(-?\d+)", out.get("exitcode", ""))
    if code:
        out["exitcode"] = int(code.group(1))
    errors = [m.group(1) for m in map(_EXC_LINE.match, tb) if m]
    if errors:
        out["error"] = errors[-1]
    return out


def _error_file_message(path: str | None) -> str | None:
    """The worker's own error file (written by @record), when it is on this host."""
    if not path or not Path(path).is_file():
        return None
    try:
        doc = json.loads(Path(path).read_text())
        msg = doc.get("message")
        return (msg.get("message") if isinstance(msg, dict) else msg) or None
    except (OSError, ValueError, AttributeError):
        return None


def describe(
    log: str, *, rc: int | None, timed_out: bool, timeout_s: float, rdzv_timeout_s: int, master: str, node_rank: int
) -> dict | None:
    """{"cause", "phase", ...} for a run that failed; None for one that ended well."""
    if rc == 0 and not timed_out:
        return None
    m = _STORE_TIMEOUT.search(log)
    if m:
        joined, expected = int(m.group(2)), int(m.group(3))
        return {
            "phase": "rendezvous",
            "node_rank": node_rank,
            "cause": f"rendezvous timed out after {m.group(1)} s (rdzv_timeout_s {rdzv_timeout_s}): {joined} of "
            f"{expected} nodes joined at {master}; the missing node(s) never reached this port",
        }
    m = _CONNECT.search(log)
    if m and node_rank != 0:
        return {
            "phase": "rendezvous",
            "node_rank": node_rank,
            "cause": f"node {node_rank} could not reach the rendezvous at {m.group(2)}:{m.group(3)} within "
            f"rdzv_timeout_s {rdzv_timeout_s}: {m.group(1)}",
        }
    if timed_out:
        return {
            "phase": "run",
            "node_rank": node_rank,
            "cause": f"the run passed timeout_s {timeout_s} and was killed (a hang: a dead peer, a collective "
            "that never completes, or too many steps for the time given)",
        }
    rc_block = root_cause(log)
    if rc_block:
        message = _error_file_message(rc_block.get("error_file")) or rc_block.get("error")
        where = f"rank {rc_block.get('rank')} (local rank {rc_block.get('local_rank')}) on {rc_block.get('host')}"
        code = rc_block.get("exitcode")
        peer = peer_lost(message)
        if peer:
            # This node's rank failed only because a peer went away: say so, so the dead node is looked for.
            at = f"the rank at {peer['peer_addr']}:{peer['peer_port']}" if peer["peer_addr"] else "a peer rank"
            return {
                "phase": "peer",
                "node_rank": node_rank,
                **rc_block,
                **peer,
                "error": message,
                "cause": f"{where} lost its connection to {at} ({peer['what']}): that node died or the network "
                "to it failed; its own result says why (this rank's error is in detail.failure.error)",
            }
        if message:
            cause = f"{where} failed first: {message}"
        elif isinstance(code, int) and code < 0:
            cause = f"{where} was {_killed_by(-code, log)}"
        else:
            cause = f"{where} exited {code}"
        return {"phase": "workers", "node_rank": node_rank, **rc_block, "cause": cause}
    errors = [m.group(1) for m in map(_EXC_LINE.match, log.splitlines()) if m]
    if isinstance(rc, int) and rc < 0 and not errors:
        # Nothing in the log: torchrun itself was killed from outside (the node going down, an operator, the OOM killer).
        return {
            "phase": "killed",
            "node_rank": node_rank,
            "signal": -rc,
            "cause": f"torchrun on node rank {node_rank} was killed by signal {-rc} before it could report",
        }
    return {
        "phase": "launch",
        "node_rank": node_rank,
        "cause": errors[-1] if errors else f"torchrun exited {rc}; see the log tail",
    }
