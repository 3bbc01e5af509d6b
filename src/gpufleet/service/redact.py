"""Secrets kept out of what leaves the fleet (an evidence bundle for a vendor). Each is replaced by [REDACTED] and
counted under the key it stood under, never with its value (`removed`, for the bundle's manifest):

    by key     the value of any key whose name says secret (secret_name: its last word password, passwd, pass,
               passphrase, secret, token, credential, authorization or cookie, or a key pair such as api_key,
               access_key, private_key, secret_key; any case, words split at '_', '-', '.' and camelCase; not a
               rate such as flops_per_token): after `=`, `:` or `=>`, the key and the value quoted or not; after a
               space where the key is a command-line flag (`--hf-token X`, `--password X`) or the value is quoted;
               a list or an object after it whole, every value in it. In JSON the member's value whatever its type
               (a boolean or null kept), at any depth; the JSON stays JSON (a list keeps its items, each redacted)
    by value   the values given with --redact, and those of this process's environment variables whose names say
               secret (VAULT_PASS, HF_TOKEN, ...), wherever they appear
    by form    credentials in URLs, Authorization headers, private keys, the token formats of common services
               (hf_, ghp_, AKIA, xox?-, JWTs, sk-)
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from typing import Any

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
    r"(?P<sep>[ \t]*(?:=>|:|=)[ \t]*|[ \t]+)"
)
_BARE = re.compile(r"[^\s,;&}\]\"'<>|]+")
_ITEM = re.compile(r"\"(?:[^\"\\\n]|\\.)*\"|'[^'\n]*'|[^\s,\[\]{}:\"']+")
_FORMS = [
    (
        "Authorization header",
        re.compile(r"(?i)(authorization[\"']?\s*[:=]\s*[\"']?)((?:bearer|basic|token)\s+[^\s\"',;]+)"),
    ),
    ("URL credentials", re.compile(r"(?i)(\b[a-z][a-z0-9+.-]*://[^\s:/@\"']+:)([^\s@/\"']+)(?=@)")),
    ("private key", re.compile(r"()(-----BEGIN [A-Z ]*PRIVATE KEY-----.*?-----END [A-Z ]*PRIVATE KEY-----)", re.S)),
    (
        "token format",
        re.compile(
            r"()\b(hf_[A-Za-z0-9]{20,}|gh[pousr]_[A-Za-z0-9]{20,}|AKIA[0-9A-Z]{16}|xox[abprs]-[A-Za-z0-9-]{10,}"
            r"|eyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}|sk-[A-Za-z0-9_-]{20,})"
        ),
    ),
]
MIN_VALUE_CHARS = 4  # shorter environment values ("1", "yes") would redact ordinary words
_CLOSE = {"[": "]", "{": "}"}


def secret_name(name: str) -> bool:
    """Whether a key's name says its value is a secret."""
    words = [w.lower() for w in _WORDS.findall(str(name))]
    if not words or (len(words) > 1 and words[-2] == "per"):  # flops_per_token: a rate
        return False
    return words[-1] in SECRET_WORDS or (len(words) > 1 and words[-1] == "key" and words[-2] in KEY_OF)


class Redactor:
    def __init__(self, values: list[str] | None = None, environ: dict | None = None):
        env = os.environ if environ is None else environ
        given = [(v, "--redact") for v in values or [] if v]
        named = [(v, f"${k}") for k, v in env.items() if secret_name(k) and len(v) >= MIN_VALUE_CHARS]
        self.values = sorted(dict(given + named).items(), key=lambda kv: len(kv[0]), reverse=True)
        self.removed: Counter = Counter()  # key (or form) -> values removed

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
        return self._by_key(text)

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
            end, replaced = self._value(text, start, json_member, (m.group("flag") or "") + m.group("key"))
            if end > start:
                out += [text[pos:start], replaced]
                pos = end
        return "".join(out) + text[pos:]

    def _value(self, text: str, i: int, json_member: bool, key: str) -> tuple[int, str]:
        """(end, replacement) of the value that starts at text[i], counted under `key`; end i when there is none."""
        first = text[i]
        if first in "\"'":
            end = _quoted_end(text, i)
            if end - i > 2:
                self.removed[key] += 1
            return end, f"{first}{REDACTED}{first}"
        if first in _CLOSE:
            end = _balanced_end(text, i)
            return end, self._whole(text[i:end], key)
        bare = _BARE.match(text, i)
        if not bare or (json_member and bare.group() in ("true", "false", "null")):
            return i, ""
        self.removed[key] += 1
        return bare.end(), f'"{REDACTED}"' if json_member else REDACTED  # a JSON number becomes a JSON string

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
