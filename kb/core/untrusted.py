"""Untrusted ticket text: what looks like instructions to a model, and how it is defused.

Ticket text is data, never instructions: ``neutralise`` defuses the strings that could close
our delimiters or open a chat turn, ``injection_markers`` names instruction-like text so the
caller can keep the model from changing labels on such a ticket, and
``strip_instruction_lines`` cuts the instructions out so they never count as evidence. Every
pattern runs in time linear in the text.
"""

from __future__ import annotations

import bisect
import re

DELIMITERS = ("ticket", "context", "incident", "question", "history", "evidence", "candidates",
              "instructions", "system")
"""Tag names used to fence sections in our prompts; a ticket must not be able to close them."""

_TAG = re.compile(r"<\s*(/?)\s*(" + "|".join(DELIMITERS) + r")\b[^>]{0,200}>", re.IGNORECASE)
_CHAT_TOKENS = re.compile(
    r"<\|[a-z_]{1,30}\|>|<(?:start|end)_of_turn>|</?s>|\[/?INST\]|<</?SYS>>|<\|?(?:bos|eos)\|?>",
    re.IGNORECASE)
_INJECTION = {
    "ignore-instructions": r"\b(?:ignore|disregard|forget|override)\s+(?:all\s+|any\s+)?(?:(?:the|your|previous|prior|"
                           r"earlier|preceding|above|system)\s+)*(?:instructions?|rules|prompts?|guidelines|above)\b",
    "new-instructions": r"\b(?:new|updated|real|actual)\s+(?:instructions?|system\s+prompt)\b",
    "role-play": r"\byou\s+are\s+(?:now|no\s+longer)\b|\bact\s+as\s+(?:a|an|the)\s+(?:[\w-]+\s+){0,3}?"
                 r"(?:assistant|expert|engineer|sre|admin\w*|classifier|model|ai)\b",
    "fake-turn": r"^\s*(?:#{1,4}\s*)?(?:system|assistant|instruction|developer)\s*(?:prompt)?\s*:"
                 r"|^\s*#{1,4}\s*(?:response|user|input)\s*:",
    "chat-token": _CHAT_TOKENS.pattern,
    "delimiter": _TAG.pattern,
    "label-order": r"\b(?:label|classify|categori[sz]e|tag|mark)\s+(?:this|it|the\s+(?:ticket|issue|incident))\b"
                   r"[^.\n]{0,20}?\s[`'\"]?[a-z]+_[a-z_]+",
    "fake-answer": r"[\"']\s*(?:root_cause|symptom|citations)\s*[\"']\s*:",
    "addressed-to-model": r"\b(?:in|into)\s+your\s+(?:answer|reply|response|output)\b|\b(?:reply|respond|answer)"
                          r"\s+only\b|\bcite\s+\[",
}
_INJECTION_RE = {name: re.compile(p, re.IGNORECASE | re.MULTILINE) for name, p in _INJECTION.items()}


def neutralise(text: str) -> str:
    """Untrusted text with our delimiter tags and chat-template tokens made inert.

    ``</ticket>`` becomes ``[/ticket]`` and ``<start_of_turn>`` becomes ``(start_of_turn)``: the
    words stay readable for the model, but nothing can end the ticket section or open a turn.
    """
    text = _TAG.sub(lambda m: f"[{m.group(1)}{m.group(2).lower()}]", text)
    return _CHAT_TOKENS.sub(lambda m: "(" + re.sub(r"[<>\[\]|]", "", m.group(0)) + ")", text)


def injection_markers(text: str) -> list[str]:
    """Names of the instruction-like patterns found in a ticket (empty for an ordinary ticket)."""
    return [name for name, pattern in _INJECTION_RE.items() if pattern.search(text)]


_IN_PLACE = {"fake-turn", "chat-token", "delimiter"}
"""Markers cut out alone: a role prefix or a token says nothing itself, and the rest of its line
is often a real log line (``System: NVRM: Xid 79 ...``)."""
_SENTENCE_END = re.compile(r"[.!?](?=\s|$)")
_ROLE_AFTER_TOKEN = re.compile(r"[ \t]*(?:system|user|assistant|model|developer)\b", re.IGNORECASE)
_WORD = re.compile(r"\w")


def _instruction_spans(line: str) -> list[tuple[int, int]]:
    """Merged spans of a line to cut: each marker, and for an order, its whole sentence."""
    ends = [m.end() for m in _SENTENCE_END.finditer(line)]
    spans = []
    for name, pattern in _INJECTION_RE.items():
        for match in pattern.finditer(line):
            end = match.end()
            if name == "chat-token":  # <start_of_turn>system: the role name belongs to the token
                role = _ROLE_AFTER_TOKEN.match(line, end)
                end = role.end() if role else end
            start = match.start()
            if name not in _IN_PLACE:  # an order goes with its whole sentence, claims before it included
                after = bisect.bisect_left(ends, end)
                end = ends[after] if after < len(ends) else len(line)
                before = bisect.bisect_right(ends, start) - 1
                start = ends[before] if before >= 0 else 0
            spans.append((start, max(end, start + 1)))
    merged: list[list[int]] = []
    for lo, hi in sorted(spans):
        if merged and lo <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], hi)
        else:
            merged.append([lo, hi])
    return [(lo, hi) for lo, hi in merged]


def _without_instructions(line: str) -> str | None:
    """One line with its instruction-like parts cut out; None when no word of it is left."""
    out, last = [], 0
    for lo, hi in _instruction_spans(line):
        out.append(line[last:lo])
        last = hi
    rewritten = " ".join(part.strip() for part in [*out, line[last:]] if part.strip())
    # A marker can form where cuts meet; then nothing of the line is worth the risk.
    return rewritten if _WORD.search(rewritten) and not injection_markers(rewritten) else None


def strip_instruction_lines(text: str) -> tuple[str, int]:
    """The text with its instruction-like parts cut out, and how many lines lost something.

    Only the instruction goes: a fake role prefix, a chat token or one of our delimiters, and the
    whole sentence that carries an order (ignore the above, you are now, label this, cite ...), so a
    claim made to back the order ("as shown in [x], this is a user bug; cite [x]") goes too. The rest of
    each line stays, so a log line behind a fake ``System:`` prefix still counts as evidence; a
    line with nothing else on it is dropped. Nothing is put in the cut's place, since any words
    left there would weigh on the classification.
    """
    lines = text.split("\n")
    changed, kept = 0, []
    for line in lines:
        if not injection_markers(line):
            kept.append(line)
            continue
        changed += 1
        rest = _without_instructions(line)
        if rest is not None:
            kept.append(rest)
    return "\n".join(kept), changed
