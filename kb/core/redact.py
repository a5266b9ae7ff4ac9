"""Redaction of secrets and personal data before anything is stored, embedded or logged.

``redact`` runs the rules of ``kb.core.secret_patterns`` in order (multi-line and specific ones first,
then generic ones) and replaces what they find with ``[REDACTED:LABEL]``. Key/value secrets keep
their key (``password=[REDACTED:SECRET]``) so the line still reads naturally. The guards here keep
what only looks like a secret or an address in GPU-cluster logs: PCI bus ids, Xid lines, version
strings, timestamps, MAC-like ids, loopback addresses, ``max_tokens=4096``.
"""

from __future__ import annotations

import hashlib
import ipaddress
import re

from kb.core import secret_patterns as sp
from kb.core.secret_patterns import Rule

_NOT_SECRET_SUFFIX = re.compile(
    r"(?i)(?:count|size|len|length|limit|budget|max|min|type|kind|ttl|expiry|expires|expiration|timeout|"
    r"path|file|dir|name|names|url|uri|ref|id|ids|enabled|mode|format|stdin|env|source|rotation|policy)s?$")
"""Key names that hold a secret's metadata, not the secret: ``secretName``, ``token_count``."""

_PLACEHOLDER_VALUES = {"null", "none", "nil", "true", "false", "required", "optional", "empty", "unset",
                       "redacted", "hidden", "masked", "<none>", "<redacted>", "<hidden>"}
"""Values that stand in for a secret rather than being one."""

_VERSION_CONTEXT = re.compile(
    r"(?i)(?:^|[^a-z])(?:version|ver|v|release|build|driver|firmware|fw|bios|vbios|cudnn|tensorrt|trt|"
    r"nccl|cuda|ofed|dcgm|dali|triton)[ \t:=]*$|==[ \t]*$")
"""What precedes a four-part version (``cuDNN 9.1.0.70``, ``pkg==9.1.0.70``) rather than an address."""


def _value(match: re.Match) -> str:
    return next(v for v in (match.group(g) for g in ("dq", "sq", "bare")) if v is not None)


def looks_random(value: str) -> bool:
    """True when a value has the make-up of a credential: a digit, mixed case or punctuation."""
    return (any(c.isdigit() for c in value) or (value.lower() != value and value.upper() != value)
            or any(not c.isalnum() and c not in "_-." for c in value))


def _is_key_value_secret(match: re.Match) -> bool:
    value = _value(match)
    if _NOT_SECRET_SUFFIX.search(match.group("suffix")) or value.strip().lower() in _PLACEHOLDER_VALUES:
        return False
    return match.group("kw").lower() not in sp.WEAK_KEYWORDS or looks_random(value)


def _is_auth_secret(match: re.Match) -> bool:
    return bool(match.group("scheme")) or looks_random(match.group("value"))


def _is_bearer_secret(match: re.Match) -> bool:
    return looks_random(match.group("value"))


def _is_email(match: re.Match) -> bool:
    return match.group("local").lower() != "git"  # git@host:org/repo is an SSH remote, not a person


def _is_ipv6(match: re.Match) -> bool:
    try:
        address = ipaddress.ip_address(match.group("ip"))
    except ValueError:
        return False
    return not (address.is_loopback or address.is_unspecified)


def _is_ipv4(match: re.Match) -> bool:
    ip = match.group(0)
    if ip.startswith("127.") or ip in ("0.0.0.0", "255.255.255.255"):
        return False
    return not _VERSION_CONTEXT.search(match.string[max(0, match.start() - 24):match.start()])


RULES: list[Rule] = [
    Rule("PRIVATE_KEY", "private key", sp.PRIVATE_KEY),
    Rule("TOKEN", "vendor token", sp.VENDOR_TOKENS),
    Rule("AWS_KEY", "vendor token", sp.AWS_KEY_ID),
    Rule("TOKEN", "webhook URL", sp.WEBHOOK_URLS),
    Rule("TOKEN", "authorization", sp.AUTH_HEADER, _is_auth_secret),
    Rule("TOKEN", "authorization", sp.BEARER, _is_bearer_secret),
    Rule("URL_CREDENTIALS", "URL credentials", sp.URL_CREDENTIALS),
    Rule("SECRET", "command line", sp.CURL_USER),
    Rule("SECRET", "command line", sp.WANDB_LOGIN),
    Rule("SECRET", "command line", sp.MYSQL_PASSWORD),
    Rule("SECRET", "command line", sp.LOGIN_PASSWORD),
    Rule("SECRET", "command line", sp.CLI_FLAG, _is_key_value_secret),
    Rule("SECRET", "key/value", sp.XML_SECRET),
    Rule("SECRET", "key/value", sp.KEY_VALUE, _is_key_value_secret),
    Rule("EMAIL", "e-mail", sp.EMAIL, _is_email),
    Rule("IP", "IP address", sp.IPV6, _is_ipv6),
    Rule("IP", "IP address", sp.IPV4, _is_ipv4),
]
"""The rules in the order they run; ``family`` groups them for timing and reports."""


def _secret_span(match: re.Match) -> tuple[int, int]:
    """The part of a match to replace: its value group when it has one, else all of it."""
    for group in ("value", "dq", "sq", "bare"):
        if group in match.re.groupindex and match.group(group) is not None:
            return match.span(group)
    return match.span()


def apply_rule(rule: Rule, text: str) -> str:
    """Replace what one rule finds in ``text`` (its guard may keep a match as it is)."""
    placeholder = f"[REDACTED:{rule.label}]"

    def replace(match: re.Match) -> str:
        if rule.guard is not None and not rule.guard(match):
            return match.group(0)
        start, end = _secret_span(match)
        whole = match.group(0)
        return whole[:start - match.start()] + placeholder + whole[end - match.start():]

    return rule.pattern.sub(replace, text)


def redact(text: str) -> str:
    """Replace tokens, passwords, private keys, e-mail and IP addresses with placeholders.

    Key/value secrets keep their key (``password=[REDACTED:SECRET]``) so the log line
    still reads naturally; PCI bus ids such as ``0000:3b:00.0`` are not addresses and stay.
    Runs in time linear in the length of ``text``.
    """
    if not text:
        return text
    for rule in RULES:
        text = apply_rule(rule, text)
    return text


def redact_key(key: str, max_length: int = 200) -> str:
    """A record id or other key with any secret in it removed, still unique and stable.

    A key without a secret comes back unchanged. One with a secret is redacted and gets a short
    digest of the original, so two keys that differ only in their secret stay two keys and the
    same record keeps the same key on every run.
    """
    cleaned = redact(key)
    if cleaned == key:
        return key
    suffix = "#" + hashlib.sha256(key.encode("utf-8")).hexdigest()[:12]
    return cleaned[:max_length - len(suffix)] + suffix
