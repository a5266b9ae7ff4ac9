"""Redaction of secrets and personal data before anything is stored or embedded."""

from __future__ import annotations

import re

# Order matters: multi-line and specific patterns first, then generic ones.
_RULES: list[tuple[str, re.Pattern[str]]] = [
    ("PRIVATE_KEY", re.compile(
        r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?(?:-----END [A-Z ]*PRIVATE KEY-----|\Z)", re.S)),
    ("TOKEN", re.compile(r"\b(?:gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,})\b")),
    ("TOKEN", re.compile(r"\b(?:xox[abpr]-[A-Za-z0-9-]{10,}|sk-[A-Za-z0-9_-]{20,}|hf_[A-Za-z0-9]{20,})\b")),
    ("AWS_KEY", re.compile(r"\b(?:AKIA|ASIA)[A-Z0-9]{16}\b")),
    ("TOKEN", re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\b")),
    ("TOKEN", re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]{16,}")),
    ("URL_CREDENTIALS", re.compile(r"(?<=://)[^\s:/@]+:[^\s@/]+(?=@)")),
    ("SECRET", re.compile(
        r"(?i)(?<![A-Za-z])((?:password|passwd|pwd|secret|token|api[_-]?key|access[_-]?key|"
        r"secret[_-]?key|auth)[\w-]*\s*[=:]\s*)(?!(?:bearer|basic)\s|\[REDACTED)(['\"]?)[^\s'\"]{4,}\2")),
    ("SECRET", re.compile(r"(?i)(\blogin\b[^\n]*?\s(?:-p|--password)(?:\s+|=))()\S+")),
    ("EMAIL", re.compile(r"\b[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}\b")),
    ("IP", re.compile(r"(?<![\d.:])(?:25[0-5]|2[0-4]\d|1?\d?\d)(?:\.(?:25[0-5]|2[0-4]\d|1?\d?\d)){3}"
                      r"(?::\d{1,5})?(?![\d.])")),
    ("IP", re.compile(r"(?<![\w:])(?:[0-9a-fA-F]{1,4}:){7}[0-9a-fA-F]{1,4}(?![\w:])")),
]


def redact(text: str) -> str:
    """Replace tokens, passwords, private keys, e-mail and IP addresses with placeholders.

    Key/value secrets keep their key (``password=[REDACTED:SECRET]``) so the log line
    still reads naturally; PCI bus ids such as ``0000:3b:00.0`` are not addresses and stay.
    """
    if not text:
        return text
    for label, pattern in _RULES:
        if label == "SECRET":
            text = pattern.sub(lambda m: f"{m.group(1)}[REDACTED:{label}]", text)
        elif label == "TOKEN" and pattern.groups:
            text = pattern.sub(lambda m: f"{m.group(1)} [REDACTED:{label}]", text)
        else:
            text = pattern.sub(f"[REDACTED:{label}]", text)
    return text

