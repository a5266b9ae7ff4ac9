"""Prompt templates as files under ``prompts/``, rendered strictly, and how a ticket is cut to fit.

A prompt ``NAME`` is two Jinja2 files, ``NAME.system.j2`` (instructions) and ``NAME.user.j2``
(data). Rendering uses ``StrictUndefined``: a missing variable is an error, not an empty
string. The sha256 of both files is recorded with every answer so a result can be traced to
the exact wording that produced it.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import jinja2

from kb.core.settings import (
    PROMPTS_DIR,  # the bundled templates, found through importlib.resources
)


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
