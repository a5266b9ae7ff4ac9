"""The patterns behind ``kb.core.redact``: what a secret or an address looks like in ticket text.

Every pattern runs in time linear in its input. Each one starts on a literal or at the start of
a run of characters (a lookbehind forbids starting inside the run), and every repetition that is
followed by something that can fail is bounded; a repetition with nothing after it is safe
unbounded, since the engine never has to give characters back. ``tests/test_redact.py`` times
each pattern family on the worst input built for it.

Vendor token formats follow the catalogue of detect-secrets' regex plugins and the vendors'
own documentation; the address patterns take their shape from Presidio's IP recognizer.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable

Guard = Callable[[re.Match], bool]
"""Says whether a match really is a secret; ``False`` keeps the text as it is."""


@dataclass(frozen=True)
class Rule:
    """One pattern: the matched text (or only its ``value`` group) becomes ``[REDACTED:LABEL]``."""

    label: str  # placeholder label: TOKEN, SECRET, PRIVATE_KEY, AWS_KEY, URL_CREDENTIALS, EMAIL, IP
    family: str  # the family the worst-case timing test and the benchmark report it under
    pattern: re.Pattern[str]
    guard: Guard | None = field(default=None, compare=False)  # domain checks a regex cannot say


_RUN = r"(?<![A-Za-z0-9_-])"  # a token starts where a run of token characters starts

PRIVATE_KEY = re.compile(
    r"-----BEGIN[A-Z0-9 ]{0,40} PRIVATE KEY(?: BLOCK)?-----.*?"
    r"(?:-----END[A-Z0-9 ]{0,40} PRIVATE KEY(?: BLOCK)?-----|\Z)", re.S)
"""PEM, OpenSSH and PGP private keys; an unterminated key is cut to the end of the text."""

VENDOR_TOKENS = re.compile(_RUN + r"(?:"
    r"gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}"  # GitHub
    r"|gl(?:pat|dt|ft|soat|rt|cbt|imt|ptt|agent|oas)-[A-Za-z0-9_-]{20,}|GR1348941[A-Za-z0-9_-]{20,}"  # GitLab
    r"|xox[a-z](?:\.xox[a-z])?-[A-Za-z0-9-]{10,}|xapp-[A-Za-z0-9-]{10,}"  # Slack
    r"|sk-[A-Za-z0-9_-]{20,}"  # OpenAI, Anthropic
    r"|[sr]k_(?:live|test)_[A-Za-z0-9]{16,}|whsec_[A-Za-z0-9]{20,}"  # Stripe
    r"|hf_[A-Za-z0-9]{20,}|nvapi-[A-Za-z0-9_-]{20,}"  # Hugging Face, NVIDIA (NGC, NIM)
    r"|AIza[0-9A-Za-z_-]{30,}|ya29\.[0-9A-Za-z_-]{20,}|GOCSPX-[A-Za-z0-9_-]{20,}"  # Google
    r"|npm_[A-Za-z0-9]{36,}|pypi-AgE[A-Za-z0-9_-]{50,}"  # package registries
    r"|SG\.[A-Za-z0-9_-]{16,}\.[A-Za-z0-9_-]{16,}"  # SendGrid
    r"|dapi[0-9a-f]{32}(?:-[0-9])?"  # Databricks
    r"|eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"  # JSON Web Token
    r")")
"""Tokens recognisable by their prefix alone."""

AWS_KEY_ID = re.compile(r"(?<![A-Za-z0-9])(?:AKIA|ASIA|ABIA|ACCA|A3T[A-Z0-9])[A-Z0-9]{16}(?![A-Za-z0-9])")

WEBHOOK_URLS = re.compile(
    r"(?<=hooks\.slack\.com/)(?:services|workflows|triggers)/[A-Za-z0-9_/-]{8,}"
    r"|(?<=discord\.com/api/webhooks/)[0-9]{5,}/[A-Za-z0-9_-]{20,}")
"""The secret path of an incoming-webhook URL (the host stays readable)."""

AUTH_HEADER = re.compile(
    r"(?i)(?<![\w-])(?:proxy-)?authorization[\"']?[ \t]{0,4}[:=][ \t]{0,4}[\"']?"
    r"(?P<scheme>(?:bearer|basic|token|digest|negotiate|apikey|sso-key)[ \t]{1,8})?(?P<value>[^\s'\",;]{8,})")
"""``Authorization: <scheme> <credentials>`` in headers, curl commands and configs."""

BEARER = re.compile(r"(?i)(?<![\w-])(?:bearer|basic)[ \t]{1,8}(?P<value>[A-Za-z0-9._~+/=-]{16,})")

URL_CREDENTIALS = re.compile(r"(?<=://)[^\s:/@]{0,128}:[^\s@/]{1,256}(?=@)")

XML_SECRET = re.compile(
    r"(?i)<[A-Za-z:_-]{0,30}?(?:password|passwd|secret|token|api[_-]?key)[A-Za-z_-]{0,20}>(?P<value>[^<\n]+)")

CURL_USER = re.compile(r"\bcurl\b[^\n]{0,200}?[ \t](?:-u|--user)[ \t]{1,4}['\"]?[^\s:'\"]{1,64}:(?P<value>[^\s'\"@]+)")

WANDB_LOGIN = re.compile(r"\bwandb[ \t]{1,4}login(?:[ \t]{1,4}--?[\w-]{1,20}){0,3}[ \t]{1,4}(?P<value>[0-9a-f]{40})\b")

MYSQL_PASSWORD = re.compile(
    r"(?<![\w-])(?:mysql|mysqldump|mysqladmin|mariadb|mariadb-dump)[ \t][^\n]{0,200}?[ \t]-p(?P<value>[^\s'\"]+)")
"""``mysql -pSECRET``: the password is glued to the flag."""

LOGIN_PASSWORD = re.compile(
    r"\b(?:login|sshpass)\b[^\n]{0,200}?[ \t](?:-p|--password)(?:[ \t]{1,4}|=)(?P<value>[^\s'\"]+)")
"""``docker login -p SECRET``, ``sshpass -p SECRET``."""

_KEYWORDS: list[tuple[str, ...]] = [
    ("password",), ("passwd",), ("passphrase",), ("pass", "phrase"), ("pwd",), ("secret",),
    ("api", "key"), ("access", "key"), ("private", "key"), ("client", "key"), ("account", "key"),
    ("storage", "key"), ("encryption", "key"), ("signing", "key"), ("master", "key"),
    ("token",), ("auth",), ("pass",),
]
"""Words that make a key name a secret's name; longer spellings come first."""

WEAK_KEYWORDS = {"token", "auth", "pass"}
"""Key words common in ordinary text: their value is redacted only when it looks random."""


def _keyword_alternatives() -> str:
    """Each keyword in its lower, Capitalised and UPPER spelling, with the word boundaries of each.

    ``dbPassword``, ``DB_PASSWORD``, ``PGPASSWORD`` and ``"password"`` are keys; ``bypass``,
    ``max_tokens``, ``author``, ``TOKENIZERS_PARALLELISM`` and the shell's ``PWD`` are not. Every
    alternative starts with a plain letter (its left boundary is checked after it), so the regex
    engine skips ahead to the next possible first letter instead of trying every position.
    """
    alternatives = []
    for words in _KEYWORDS:
        rest = "".join(f"[_-]?[{w[0]}{w[0].upper()}]{w[1:]}" for w in words[1:])
        lower, upper = words[0] + rest, "[_-]?".join(w.upper() for w in words)
        alternatives.append(f"{lower[0]}(?<![A-Za-z].){lower[1:]}(?![a-z])")
        alternatives.append(f"{lower[0].upper()}{lower[1:]}(?![a-z])")
        if upper == "PWD":  # the shell's working directory, unless a prefix makes it a password
            alternatives.append("P(?<=[A-Z0-9_].)(?<!OLDP)WD(?![A-Za-z])")
        else:
            alternatives.append(f"{upper[0]}(?<![a-z].){upper[1:]}(?![A-Za-z])")
    return "|".join(alternatives)


_KW = _keyword_alternatives()
_VALUE = r"(?:\"(?P<dq>[^\"\n]+)|'(?P<sq>[^'\n]+)|(?P<bare>[^\s'\"]{4,}))"

KEY_VALUE = re.compile(
    rf"(?P<kw>{_KW})(?P<suffix>[\w.-]{{0,40}})[\"']?[ \t]{{0,4}}(?::=|=>|[:=])[ \t]{{0,4}}"
    rf"(?![\"']?(?:\[REDACTED|\$\{{?\w|\*{{3}})){_VALUE}")
"""``password=x``, ``"api_key": "x"``, ``{'token': 'x'}``, ``PGPASSWORD=x``, ``client-key-data: x``."""

CLI_FLAG = re.compile(
    rf"-(?<![\w-]-)-?(?:[A-Za-z0-9]{{1,20}}[_-]){{0,3}}(?P<kw>{_KW})(?P<suffix>[A-Za-z0-9_-]{{0,30}})[ \t]{{1,4}}"
    r"(?![\"']?(?:\[REDACTED|\$\{?\w))(?:\"(?P<dq>[^\"\n]+)|'(?P<sq>[^'\n]+)|(?P<bare>[^\s'\"-][^\s'\"]{3,}))")
"""``--password SECRET``, ``--db-password 'SECRET'``, ``--token SECRET``."""

EMAIL = re.compile(
    r"(?<![A-Za-z0-9._%+-])(?P<local>[A-Za-z0-9._%+-]{1,64})@"
    r"[A-Za-z0-9-]{1,63}(?:\.[A-Za-z0-9-]{1,63}){0,8}\.[A-Za-z]{2,24}(?![A-Za-z0-9-])")

_H = r"[0-9A-Fa-f]{1,4}"
_V4 = r"\d{1,3}(?:\.\d{1,3}){3}"
IPV6 = re.compile(
    rf"(?<![\w:.])(?=[0-9A-Fa-f:]{{0,39}}[0-9])(?P<ip>{_H}(?::{_H}){{7}}"
    rf"|(?:{_H}(?::{_H}){{0,6}})?::(?:(?:{_H}:){{0,5}}{_V4}|{_H}(?::{_H}){{0,6}})?"
    rf"|(?:{_H}:){{6}}{_V4})"
    r"(?:%[A-Za-z0-9_.-]{1,16})?(?![\w:]|\.\w)")
"""Full, compressed (``2001:db8::1``), zoned (``fe80::1%eth0``) and v4-mapped IPv6 addresses;
the candidates are checked by ``ipaddress``, so timestamps, MACs and PCI ids never qualify. An
address has a digit: ``dead::beef`` and ``add::`` are words, not hosts."""

_OCTET = r"(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)"
IPV4 = re.compile(rf"(?<![\w.])(?<!\d-){_OCTET}(?:\.{_OCTET}){{3}}(?!\w|\.\d)")
"""Dotted quads; a sentence's full stop may follow, a fifth number may not (``96.00.89.00.01``)."""
