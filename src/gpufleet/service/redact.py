"""Secrets kept out of what leaves the fleet (an evidence bundle for a vendor): values named as secrets (--redact),
the values of this process's environment variables whose names say they are secrets, values whose key says so
(`key=value`, `key: value`, a JSON member), credentials in URLs, Authorization headers, private keys, and the token
formats of the common services. Each is replaced by [REDACTED]; the count is kept."""

from __future__ import annotations

import os
import re
from typing import Any

REDACTED = "[REDACTED]"
# A name that says its value is a secret; not "tokens" (tokens_per_s is a figure) nor "pwd" (the working folder).
SECRET_NAME = r"(?:password|passwd|passphrase|secret|token(?!s)|api[_-]?key|access[_-]?key|private[_-]?key|credentials?|authorization)"
_NAME = re.compile(rf"(?i).*{SECRET_NAME}.*")
_VALUE = rf"(\"[^\"\n]*\"|'[^'\n]*'|(?!{re.escape(REDACTED)})[^\s\"',;&}}\]]+)"
_PATTERNS = [
    re.compile(rf"(?i)(authorization[\"']?\s*[:=]\s*[\"']?(?:bearer|basic|token)\s+){_VALUE}"),
    re.compile(rf"(?i)([A-Za-z0-9_.-]*{SECRET_NAME}[A-Za-z0-9_.-]*[\"']?\s*[:=]\s*){_VALUE}"),
    re.compile(r"(?i)(\b[a-z][a-z0-9+.-]*://[^\s:/@\"']+:)([^\s@/\"']+)(?=@)"),
    re.compile(r"()(-----BEGIN [A-Z ]*PRIVATE KEY-----.*?-----END [A-Z ]*PRIVATE KEY-----)", re.S),
    re.compile(
        r"()\b(hf_[A-Za-z0-9]{20,}|gh[pousr]_[A-Za-z0-9]{20,}|AKIA[0-9A-Z]{16}|xox[abprs]-[A-Za-z0-9-]{10,}"
        r"|eyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}|sk-[A-Za-z0-9_-]{20,})"
    ),
]
MIN_VALUE_CHARS = 4  # shorter environment values ("1", "yes") would redact ordinary words


def _replace(m: re.Match) -> str:
    value = m.group(2)
    quote = value[0] if value[:1] in "\"'" and len(value) > 1 and value[-1] == value[0] else ""
    return f"{m.group(1)}{quote}{REDACTED}{quote}"


class Redactor:
    def __init__(self, values: list[str] | None = None, environ: dict | None = None):
        env = os.environ if environ is None else environ
        named = [v for k, v in env.items() if _NAME.fullmatch(k) and len(v) >= MIN_VALUE_CHARS]
        self.values = sorted({v for v in [*(values or []), *named] if v}, key=len, reverse=True)
        self.count = 0

    def text(self, text: str) -> str:
        for value in self.values:
            if value in text:
                self.count += text.count(value)
                text = text.replace(value, REDACTED)
        for pattern in _PATTERNS:
            text, n = pattern.subn(_replace, text)
            self.count += n
        return text

    def json(self, value: Any, key: str = "") -> Any:
        """A JSON value with the members whose key says secret replaced whole, and every string redacted as text:
        still valid JSON."""
        if (
            key
            and _NAME.fullmatch(key)
            and value not in (None, "", REDACTED)
            and not isinstance(value, (dict, list, bool))
        ):
            self.count += 1
            return REDACTED
        if isinstance(value, dict):
            return {k: self.json(v, str(k)) for k, v in value.items()}
        if isinstance(value, list):
            return [self.json(v) for v in value]
        return self.text(value) if isinstance(value, str) else value
