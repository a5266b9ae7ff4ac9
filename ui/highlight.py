"""Safe rendering of untrusted ticket text: escaping, and evidence spans highlighted."""

from __future__ import annotations

import re
from urllib.parse import quote, urlparse

from kb.core.suggestion import Evidence

_MARKDOWN_SPECIAL = re.compile(r"([\\`*_{}\[\]()<>#+\-.!|~$=:])")
# HTML's own characters and those that markdown, Streamlit's LaTeX and emoji shortcodes read,
# replaced in one pass by numeric entities so they are shown literally inside an HTML block.
_ENTITIES = {ord(c): f"&#{ord(c)};" for c in "&<>\"'`*_[]{}()#+-!|~$\\:="}
_TAME = {ord(c): f"\\{c}" for c in "\\[]<$"}
_ELLIPSIS = "..."


def escape_markdown(text: str | None) -> str:
    """Text shown literally by st.markdown: every markdown, HTML and LaTeX character escaped."""
    return _MARKDOWN_SPECIAL.sub(r"\\\1", text or "").replace("\n", "  \n")


def tame_markdown(text: str) -> str:
    """Markdown that keeps emphasis, lists and code but can show no image, link, HTML or LaTeX.

    Works character by character, so it is safe on streamed chunks cut anywhere.
    """
    return text.translate(_TAME)


def _escape_html(text: str) -> str:
    return text.translate(_ENTITIES)


def evidence_span(text: str, item: Evidence) -> tuple[int, int] | None:
    """Where the evidence sits in the text: its own offsets when they fit, else found again.

    The offsets fit when the span they cover is part of the evidence's quoted line; otherwise
    (a suggestion made on a differently redacted or edited text) the quoted line is searched
    for, and None is returned when it is not in the text at all.
    """
    quoted = item.text.strip()
    core = quoted.removeprefix(_ELLIPSIS).removesuffix(_ELLIPSIS).strip()
    start, end = item.start, item.end
    if 0 <= start < end <= len(text):
        span = text[start:end].strip()
        if span and (span in core or core in span):
            return start, end
    if not core:
        return None
    found = text.find(core)
    if found < 0:
        found = text.lower().find(core.lower())
    return (found, found + len(core)) if found >= 0 else None


def merge_spans(spans: list[tuple[int, int, str]]) -> list[tuple[int, int, str]]:
    """Sorted, non-overlapping spans; overlapping ones are joined and their notes combined."""
    merged: list[tuple[int, int, str]] = []
    for start, end, note in sorted(spans):
        if merged and start < merged[-1][1]:
            last_start, last_end, last_note = merged[-1]
            notes = last_note if note in last_note.split("; ") else f"{last_note}; {note}"
            merged[-1] = (last_start, max(last_end, end), notes)
        else:
            merged.append((start, end, note))
    return merged


def highlight_evidence(text: str, evidence: list[Evidence]) -> tuple[str, int]:
    """The ticket text as one line of safe HTML with evidence in <mark>; and how many were marked.

    The result has no raw newline, so markdown treats it as a single HTML block and leaves
    the (escaped) ticket text alone.
    """
    spans = []
    for item in evidence:
        where = evidence_span(text, item)
        if where:
            spans.append((where[0], where[1], f"{item.signal}: {item.explanation}"))
    parts, position = [], 0
    merged = merge_spans(spans)
    for start, end, note in merged:
        parts.append(_escape_html(text[position:start]))
        parts.append(f'<mark title="{_escape_html(note)}">{_escape_html(text[start:end])}</mark>')
        position = end
    parts.append(_escape_html(text[position:]))
    body = "".join(parts).replace("\r\n", "\n").replace("\n", "<br>")
    return (f'<div class="pmkb-ticket" style="white-space: pre-wrap; font-family: monospace; '
            f'font-size: 0.85em; line-height: 1.45">{body}</div>'), len(merged)


def safe_link(url: str | None) -> str | None:
    """A markdown link target for an http(s) URL, or None for anything else (paths, labels)."""
    if not url:
        return None
    parsed = urlparse(url.strip())
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        return None
    return quote(url.strip(), safe=":/?&=#%@+,;~")
