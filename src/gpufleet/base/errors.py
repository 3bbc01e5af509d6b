import difflib


class InputError(ValueError):
    """Bad input (file, option, inventory variable). The message names it and what was expected."""


def nearest(name: str, known) -> str | None:
    """The known name nearest to a misspelt one (difflib), else one that holds it or that it holds, else None."""
    known = list(known)
    near = difflib.get_close_matches(name, known, n=1) or [k for k in known if name and (name in k or k in name)]
    return near[0] if near else None


def did_you_mean(name: str, known) -> str:
    """The text " did you mean X?" for the known name nearest to name, or "" when none is near."""
    near = nearest(name, known)
    return f" did you mean {near}?" if near else ""


# Every gpufleet command exits with these codes; each parser's --help and docs/operations.md show this table.
EXIT_CODES = """\
exit codes (every gpufleet command):
  0    done: every result passed or warned (report, fleet: every node accepted; locate: nothing slow;
       status, hw: the GPUs read; certify: every node certified; verify: the certificate valid)
  1    a result failed or erred (report, fleet: a node not accepted; locate: a slow node or link named;
       status, hw: no GPU could be read, after showing what could; certify: a node not certified; verify:
       the certificate not valid, the reason said); check, bench, counters and finetune exit 0 here with
       --exit-zero
  2    bad input or could not run: the message names the variable, file or host and what was expected
  130  interrupted (Ctrl-C or SIGTERM)"""
