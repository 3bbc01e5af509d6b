"""Secrets kept out of what leaves the fleet (an evidence bundle for a vendor). Each is replaced by [REDACTED] and
counted under the key it stood under, never with its value (`removed`, for the bundle's manifest):

    by key     the value of any key whose name says secret (secret_name: its last word password, passwd, pass,
               passphrase, secret, token, credential, authorization or cookie, or a key pair such as api_key,
               access_key, private_key, secret_key; any case, words split at '_', '-', '.' and camelCase; not a
               rate such as flops_per_token; or a key detect-secrets' keyword list names: PGPASSWORD,
               secret_key_base, password_file): after `=`, `:`, `:=` or `=>`, the key and the value quoted or not
               (`@"X"`, `b'X'`, `!!binary X` too); after a space where the key is a command-line flag
               (`--hf-token X`, `--password X`) or the value is quoted; a list or an object after it whole, every
               value in it; in YAML the lines under it (a block scalar `password: |`, a list, a mapping). In JSON
               the member's value whatever its type (a boolean or null kept), at any depth; the JSON stays JSON
    by value   the values given with --redact, and those of this process's environment variables whose names say
               secret (VAULT_PASS, HF_TOKEN, ...; not PWD, the shell's working folder), wherever they appear
    by form    credentials in URLs, Authorization headers, private key blocks (PEM, OpenSSH, PGP; one without its
               END line to the text's end), a password stuck to mysql's -p, the token formats of common services
               (hf_, ghp_, AKIA, xox?-, JWTs, sk-)
    by detector  what detect-secrets' detectors find in a line, counted under `detect-secrets: <its type>`: its
               keyword detector (the key forms of config files, Go, C, C++ and quoted code: `db_pass := X`,
               `if ("X" == password)`) and each service's token format (AWS, Slack, Stripe, npm, PyPI, ...). Not
               its entropy detectors, which take any random-looking quoted string (a firmware checksum, a commit),
               nor its public-IP one: a vendor needs those.

A value found by key or by a detector that is WIDE_VALUE_CHARS long or more is replaced wherever else it is in the
text too (`foreign_key_id = X` after `secret = X`).
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from typing import Any

from detect_secrets.core.plugins.util import get_mapping_from_secret_type_to_class
from detect_secrets.plugins.base import RegexBasedDetector
from detect_secrets.plugins.keyword import DENYLIST, KeywordDetector

REDACTED = "[REDACTED]"
SECRET_WORDS = {
    "password",
    "passwd",
    "pass",
    "passphrase",
    "secret",
    "secrets",
    "token",
    "credential",
    "credentials",
    "authorization",
    "cookie",
    "apikey",
    "accesskey",
    "privatekey",
    "secretkey",
}
KEY_OF = {"api", "access", "private", "secret", "auth", "encryption", "signing", "client", "session", "master"}
_WORDS = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|\d+")
# A key and what separates it from its value: `=`, `:`, `=>` (spaces around), or spaces after a flag or before a
# quoted value, a list or an object. The value is read by _value().
_KEYED = re.compile(
    r"(?<![A-Za-z0-9_.\-])(?P<flag>--?)?(?P<q>[\"']?)(?P<key>[A-Za-z_][A-Za-z0-9_.\-]*)(?P=q)"
    r"(?P<sep>[ \t]*(?:=>|:=|:|=(?!=))[ \t]*|[ \t]+)"
)
# What stands before a value and stays: a string's prefix (@"X" in C# and Objective-C, b'X' and f"X" in Python)
# or a YAML tag (`!!binary X`).
_STRING_PREFIX = re.compile(r"(?:@|[bBrRuUfF]{1,2})(?=[\"'])|!{1,2}[\w.-]*[ \t]+")
_BARE = re.compile(r"[^\s,;&}\]\"'<>|]+")
_ITEM = re.compile(r"\"(?:[^\"\\\n]|\\.)*\"|'[^'\n]*'|[^\s,\[\]{}:\"']+")
_FORMS = [
    (
        "Authorization header",
        re.compile(r"(?i)(authorization[\"']?\s*[:=]\s*[\"']?)((?:bearer|basic|token)\s+[^\s\"',;]+)"),
    ),
    ("URL credentials", re.compile(r"(?i)(\b[a-z][a-z0-9+.-]*://[^\s:/@\"']+:)([^\s@/\"']+)(?=@)")),
    (
        "private key",
        re.compile(r"()(-----BEGIN ([A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?)-----.*?(?:-----END \3-----|\Z))", re.S),
    ),
    ("mysql -p", re.compile(r"(\b(?:mysql\w*|mariadb\w*)\b[^\n|;&]*?\s-p)([^\s|;&]+)")),
    (
        "token format",
        re.compile(
            r"()\b(hf_[A-Za-z0-9]{20,}|gh[pousr]_[A-Za-z0-9]{20,}|AKIA[0-9A-Z]{16}|xox[abprs]-[A-Za-z0-9-]{10,}"
            r"|eyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}|sk-[A-Za-z0-9_-]{20,})"
        ),
    ),
]
# detect-secrets' detectors but its entropy and public-IP ones (the module's docstring says why); its keyword
# detector once for each family of key forms it knows, by a file name of that family.
_DETECTORS = [
    cls()
    for name, cls in sorted(get_mapping_from_secret_type_to_class().items())
    if cls.__name__ not in ("Base64HighEntropyString", "HexHighEntropyString", "IPPublicDetector")
]
_KEYWORD_FAMILIES = ("x.conf", "x.go", "x.c", "x.cpp", "x.py")
# A line is given to the detectors only where one of their own patterns (or a word of the keyword list) is in it:
# a bug report of a million lines costs a search of the whole text for each pattern.
_LIBRARY_KEY = re.compile("|".join(DENYLIST), re.IGNORECASE)
_PREFILTERS = [_LIBRARY_KEY] + [p for d in _DETECTORS if isinstance(d, RegexBasedDetector) for p in d.denylist]
_SHELL_FOLDERS = {"PWD", "OLDPWD"}  # a key of the keyword list (pwd), but the shell's working folder
_BLOCK_START = re.compile(r"[|>][-+0-9]*[ \t]*(?:#[^\n]*)?(?=\n)|[ \t]*(?:#[^\n]*)?(?=\n)")
WIDE_VALUE_CHARS = 8  # a value a detector found is replaced all through the text from this length
MIN_VALUE_CHARS = 4  # shorter environment values ("1", "yes") would redact ordinary words
_CLOSE = {"[": "]", "{": "}"}


def secret_name(name: str) -> bool:
    """Whether a key's name says its value is a secret."""
    words = [w.lower() for w in _WORDS.findall(str(name))]
    if not words or (len(words) > 1 and words[-2] == "per"):  # flops_per_token: a rate
        return False
    ours = words[-1] in SECRET_WORDS or (len(words) > 1 and words[-1] == "key" and words[-2] in KEY_OF)
    return ours or bool(_LIBRARY_KEY.search(str(name)))


class Redactor:
    def __init__(self, values: list[str] | None = None, environ: dict | None = None):
        env = os.environ if environ is None else environ
        given = [(v, "--redact") for v in values or [] if v]
        named = [
            (v, f"${k}")
            for k, v in env.items()
            if secret_name(k) and k not in _SHELL_FOLDERS and len(v) >= MIN_VALUE_CHARS
        ]
        self.values = sorted(dict(given + named).items(), key=lambda kv: len(kv[0]), reverse=True)
        self.removed: Counter = Counter()  # key (or form) -> values removed
        self._wide: dict[str, str] = {}

    @property
    def count(self) -> int:
        return sum(self.removed.values())

    def text(self, text: str) -> str:
        for value, key in self.values:
            if value in text:
                self.removed[key] += text.count(value)
                text = text.replace(value, REDACTED)
        for what, pattern in _FORMS:
            text, n = pattern.subn(lambda m: f"{m.group(1)}{REDACTED}", text)
            if n:
                self.removed[what] += n
        self._wide: dict[str, str] = {}  # value -> key, of the values the rules by key found in this text
        text = self._by_detector(self._by_key(text))
        for value, key in sorted(self._wide.items(), key=lambda kv: len(kv[0]), reverse=True):
            if value in text:  # the same value elsewhere, under no key (`foreign_key_id = X`)
                self.removed[key] += text.count(value)
                text = text.replace(value, REDACTED)
        return text

    def _by_detector(self, text: str) -> str:
        """What detect-secrets' detectors find in the lines their patterns touch: a value of WIDE_VALUE_CHARS or
        more wherever it is in the text, a shorter one in its line alone (`1234` would take figures with it)."""
        starts = {text.rfind("\n", 0, m.start()) + 1 for pattern in _PREFILTERS for m in pattern.finditer(text)}
        out, pos, wide = [], 0, {}
        for start in sorted(starts):
            end = text.find("\n", start)
            end = len(text) if end < 0 else end
            line = text[start:end]
            for value, kind in sorted(_detected(line).items(), key=lambda kv: len(kv[0]), reverse=True):
                if len(value) >= WIDE_VALUE_CHARS:
                    wide.setdefault(value, kind)
                elif value in line:
                    self.removed[f"detect-secrets: {kind}"] += line.count(value)
                    line = line.replace(value, REDACTED)
            out += [text[pos:start], line]
            pos = end
        text = "".join(out) + text[pos:]
        for value, kind in sorted(wide.items(), key=lambda kv: len(kv[0]), reverse=True):
            if value in text:
                self.removed[f"detect-secrets: {kind}"] += text.count(value)
                text = text.replace(value, REDACTED)
        return text

    def _by_key(self, text: str) -> str:
        out, pos = [], 0
        for m in _KEYED.finditer(text):
            start = m.end()
            if m.start() < pos or not secret_name(m.group("key")) or text.startswith(REDACTED, start):
                continue
            spaced = not m.group("sep").strip()
            if start >= len(text) or (spaced and not m.group("flag") and text[start] not in "\"'[{"):
                continue  # `token expired`: a word after a word, no value
            json_member = m.group("q") == '"' and m.group("sep").strip() == ":"
            key = (m.group("flag") or "") + m.group("key")
            block = _BLOCK_START.match(text, start) if m.group("sep").strip() == ":" else None
            if block:  # YAML: the value is on the lines below, indented deeper than the key
                column = m.start() - text.rfind("\n", 0, m.start()) - 1
                start = block.end()  # the indicator (`|`, `>-`) stays
                end, replaced = self._block(text, start, column, key)
            else:
                end, replaced = self._value(text, start, json_member, key)
            if end > start:
                out += [text[pos:start], replaced]
                pos = end
        return "".join(out) + text[pos:]

    def _block(self, text: str, i: int, column: int, key: str) -> tuple[int, str]:
        """(end, replacement) of the lines after text[i] (a newline) indented deeper than `column` (a YAML block
        scalar, or a list or mapping under the key), each replaced whole; end i when there is none."""
        lines, j, end = [], i, i
        while j < len(text):
            nxt = text.find("\n", j + 1)
            nxt = len(text) if nxt < 0 else nxt
            line = text[j + 1 : nxt]
            body = line.lstrip(" \t")
            if body and len(line) - len(body) <= column:
                break
            lines.append(line[: len(line) - len(body)] + REDACTED if body else line)
            j, end = nxt, nxt if body else end
        if end == i:
            return i, ""
        self.removed[key] += 1
        return end, "\n" + "\n".join(lines[: text.count("\n", i, end)])

    def _value(self, text: str, i: int, json_member: bool, key: str) -> tuple[int, str]:
        """(end, replacement) of the value that starts at text[i], counted under `key`; end i when there is none."""
        prefix = _STRING_PREFIX.match(text, i)
        lead, i = (prefix.group(), prefix.end()) if prefix else ("", i)
        first = text[i]
        if first in "\"'":
            end = _quoted_end(text, i)
            if end - i > 2:
                self.removed[key] += 1
                self._keep_wide(text[i + 1 : end - 1], key)
            return end, f"{lead}{first}{REDACTED}{first}"
        if first in _CLOSE:
            end = _balanced_end(text, i)
            return end, self._whole(text[i:end], key)
        bare = _BARE.match(text, i)
        if not bare or (json_member and bare.group() in ("true", "false", "null")):
            return i, ""
        self.removed[key] += 1
        self._keep_wide(bare.group(), key)
        return bare.end(), f'"{REDACTED}"' if json_member else REDACTED  # a JSON number becomes a JSON string

    def _keep_wide(self, value: str, key: str) -> None:
        if len(value) >= WIDE_VALUE_CHARS and REDACTED not in value:
            self._wide.setdefault(value, key)

    def _whole(self, segment: str, key: str) -> str:
        """A list or object after a secret key, every value in it redacted: as JSON when it is JSON."""
        try:
            return json.dumps(self._all(json.loads(segment), key))
        except ValueError:
            inner = segment[1:-1]
            self.removed[key] += len(_ITEM.findall(inner))
            return segment[0] + _ITEM.sub(lambda m: _quote_like(m.group()), inner) + segment[-1]

    def _all(self, value: Any, key: str) -> Any:
        """Every leaf under a secret key replaced (a boolean or null kept); counted under `key`."""
        if isinstance(value, dict):
            return {k: self._all(v, key) for k, v in value.items()}
        if isinstance(value, list):
            return [self._all(v, key) for v in value]
        if value is None or isinstance(value, bool) or value in ("", REDACTED):
            return value
        self.removed[key] += 1
        return REDACTED

    def json(self, value: Any, key: str = "") -> Any:
        """A JSON value with every member whose key says secret replaced, whatever it holds, and every string
        redacted as text: still valid JSON."""
        if key and secret_name(key):
            return self._all(value, key)
        if isinstance(value, dict):
            return {k: self.json(v, str(k)) for k, v in value.items()}
        if isinstance(value, list):
            return [self.json(v) for v in value]
        return self.text(value) if isinstance(value, str) else value


def _detected(line: str) -> dict[str, str]:
    """{value: its type} of what detect-secrets' detectors find in `line`; a value shorter than MIN_VALUE_CHARS, or
    one holding what was already replaced, left (what remains of `b"[REDACTED]"` is `b`)."""
    found = {}
    for detector in _DETECTORS:
        for name in _KEYWORD_FAMILIES if isinstance(detector, KeywordDetector) else _KEYWORD_FAMILIES[:1]:
            for secret in detector.analyze_line(filename=name, line=line, line_number=0):
                value = secret.secret_value or ""
                if len(value.strip()) >= MIN_VALUE_CHARS and REDACTED not in value:
                    found.setdefault(value, secret.type)
    return found


def _quote_like(word: str) -> str:
    """REDACTED in the quotes `word` has, if any."""
    return f"{word[0]}{REDACTED}{word[0]}" if word[0] in "\"'" else REDACTED


def _quoted_end(text: str, i: int) -> int:
    """The index after the quote that closes the one at text[i] (a backslash escapes in double quotes); the line's
    end when none does."""
    q, j = text[i], i + 1
    while j < len(text) and text[j] != "\n":
        if text[j] == "\\" and q == '"':
            j += 2
            continue
        if text[j] == q:
            return j + 1
        j += 1
    return j


def _balanced_end(text: str, i: int) -> int:
    """The index after the bracket that closes the one at text[i], quotes respected; the text's end when none does."""
    depth, j = 0, i
    while j < len(text):
        c = text[j]
        if c in "\"'":
            j = _quoted_end(text, j)
            continue
        if c in "[{":
            depth += 1
        elif c in "]}":
            depth -= 1
            if depth == 0:
                return j + 1
        j += 1
    return len(text)
