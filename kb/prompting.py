"""Prompt templates as files under ``prompts/``, rendered strictly, and the untrusted-text guards.

A prompt ``NAME`` is two Jinja2 files, ``NAME.system.j2`` (instructions) and ``NAME.user.j2``
(data). Rendering uses ``StrictUndefined``: a missing variable is an error, not an empty
string. The sha256 of both files is recorded with every answer so a result can be traced to
the exact wording that produced it.

Ticket text is data, never instructions: ``neutralise`` defuses the strings that could close
our delimiters or open a chat turn, and ``injection_markers`` names instruction-like text so
the caller can keep the model from changing labels on such a ticket.
"""

from __future__ import annotations

import bisect
import hashlib
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import jinja2

from kb.settings import PROMPTS_DIR  # the bundled templates, found through importlib.resources

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


class PromptError(ValueError):
    """A prompt template that is missing, broken or rendered without a variable it needs."""


@dataclass(frozen=True)
class PromptTemplate:
    """A named pair of system and user templates with the hash of their text."""

    name: str
    system: str
    user: str

    @property
    def sha256(self) -> str:
        """Hash of both template files; changes whenever the wording does."""
        return hashlib.sha256(f"{self.system}\0{self.user}".encode("utf-8")).hexdigest()

    def record(self) -> dict:
        """What a trace records about the template."""
        return {"name": self.name, "sha256": self.sha256}

    def render(self, **variables) -> list[dict[str, str]]:
        """System and user messages; raises PromptError naming a missing variable."""
        env = jinja2.Environment(undefined=jinja2.StrictUndefined, autoescape=False,
                                 keep_trailing_newline=False, trim_blocks=True, lstrip_blocks=True)
        try:
            return [{"role": "system", "content": env.from_string(self.system).render(**variables).strip()},
                    {"role": "user", "content": env.from_string(self.user).render(**variables).strip()}]
        except jinja2.UndefinedError as exc:
            raise PromptError(f"prompt {self.name!r}: {exc}; pass it to render()") from exc
        except jinja2.TemplateSyntaxError as exc:
            raise PromptError(f"prompt {self.name!r} line {exc.lineno}: {exc.message}") from exc


@lru_cache(maxsize=32)
def load_prompt(name: str, folder: Path = PROMPTS_DIR) -> PromptTemplate:
    """Read ``NAME.system.j2`` and ``NAME.user.j2`` from the prompts folder."""
    parts = {}
    for role in ("system", "user"):
        path = Path(folder) / f"{name}.{role}.j2"
        try:
            parts[role] = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise PromptError(f"prompt {name!r}: cannot read {path}: {exc}") from exc
    return PromptTemplate(name=name, **parts)


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


def _line_span(text: str, start: int, end: int, around: int) -> tuple[int, int]:
    """The whole lines holding [start, end), widened by ``around`` lines on each side."""
    lo = text.rfind("\n", 0, start) + 1
    for _ in range(around):
        if lo == 0:
            break
        lo = text.rfind("\n", 0, lo - 1) + 1
    hi = text.find("\n", end)
    hi = len(text) if hi == -1 else hi
    for _ in range(around):
        if hi >= len(text):
            break
        nxt = text.find("\n", hi + 1)
        hi = len(text) if nxt == -1 else nxt
    return lo, hi


def trim_around_evidence(text: str, spans: list[tuple[int, int]], limit: int, around: int = 2) -> str:
    """Shorten a ticket to about ``limit`` characters, keeping the evidence lines whole.

    Kept, in order of priority: the lines around each evidence span, the head (title and
    first lines) and the tail (where logs end). Cuts fall on line boundaries and are marked.
    """
    if len(text) <= limit:
        return text
    keep: list[tuple[int, int]] = []
    budget = limit
    for start, end in spans:
        lo, hi = _line_span(text, start, end, around)
        if hi - lo > budget:
            lo, hi = _line_span(text, start, end, 0)
        if hi - lo > budget:  # one very long line: keep a window around the match itself
            half = max((budget - (end - start)) // 2, 0)
            lo, hi = max(start - half, lo), min(end + half, hi)
            if hi - lo > budget:
                continue
        keep.append((lo, hi))
        budget -= hi - lo
    head_end = text.rfind("\n", 0, max(budget * 2 // 3, 0))
    if head_end > 0:
        keep.append((0, head_end))
        budget -= head_end
    tail_start = text.find("\n", len(text) - max(budget, 0))
    if budget > 0 and tail_start != -1:
        keep.append((tail_start + 1, len(text)))
    merged: list[list[int]] = []
    for lo, hi in sorted(keep):
        if merged and lo <= merged[-1][1] + 1:
            merged[-1][1] = max(merged[-1][1], hi)
        else:
            merged.append([lo, hi])
    out, last = [], 0
    for lo, hi in merged:
        if lo > last:
            out.append(f"[... {lo - last} characters trimmed ...]")
        out.append(text[lo:hi].strip("\n"))
        last = hi
    if last < len(text):
        out.append(f"[... {len(text) - last} characters trimmed ...]")
    return "\n".join(out)


_CITATION = re.compile(r"\[([A-Za-z][\w.:-]*?\d[\w.:-]*)\]")


def cited_ids(text: str) -> list[str]:
    """Incident-like ids cited in square brackets (``[hw-gpu-003]``), in order, without repeats."""
    return list(dict.fromkeys(_CITATION.findall(text)))


_IN_PLACE = {"fake-turn", "chat-token", "delimiter"}
"""Markers cut out alone: a role prefix or a token says nothing itself, and the rest of its line
is often a real log line (``System: NVRM: Xid 79 ...``)."""
_SENTENCE_END = re.compile(r"[.!?](?=\s|$)")
_ROLE_AFTER_TOKEN = re.compile(r"[ \t]*(?:system|user|assistant|model|developer)\b", re.IGNORECASE)
_WORD = re.compile(r"\w")


def _instruction_spans(line: str) -> list[tuple[int, int]]:
    """Merged spans of a line to cut: each marker, and for an order, the rest of its sentence."""
    ends = [m.end() for m in _SENTENCE_END.finditer(line)]
    spans = []
    for name, pattern in _INJECTION_RE.items():
        for match in pattern.finditer(line):
            end = match.end()
            if name == "chat-token":  # <start_of_turn>system: the role name belongs to the token
                role = _ROLE_AFTER_TOKEN.match(line, end)
                end = role.end() if role else end
            elif name not in _IN_PLACE:
                after = bisect.bisect_left(ends, end)
                end = ends[after] if after < len(ends) else len(line)
            spans.append((match.start(), max(end, match.start() + 1)))
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

    Only the instruction goes: a fake role prefix, a chat token or one of our delimiters, and an
    order (ignore the above, you are now, label this ...) to the end of its sentence. The rest of
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
