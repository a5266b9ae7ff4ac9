"""How pmkb cuts text into words: one token pattern and one stop-word list, for lexical retrieval,
the text classifier and the too-little-text check (which also leaves out vague words).

The hashing embedder keeps its own tokens: they are part of that model, whose vectors a store
keeps, and changing them would mix vectors of two models under one name."""

from __future__ import annotations

import re

from kb.core.english_stop_words import ENGLISH_STOP_WORDS

TOKEN_PATTERN = r"[a-z_][a-z0-9_]+|\d+"
"""A word (a letter or an underscore, then letters, digits or underscores) or a number, in lower-cased
text (the text classifier lower-cases before it applies the pattern)."""
_TOKEN = re.compile(TOKEN_PATTERN)

STOP_WORDS = frozenset("""a an and are as at be been but by can do does for from had has have i if in into is it
its job jobs my no not of on or our so that the their then there these this to was we were what when which
while will with you your after before again also all any been being did get got how just more most now one
only other out over same some still than them they too up very why would""".split())
"""Words that say nothing about an incident: English function words and the ones every ticket has
("job", "got"). Retrieval drops them. Kept short on purpose: "system", "empty" or "full" tell
something in a ticket (measured: retrieving with scikit-learn's longer English list lowered
neighbour-vote accuracy on labelled tickets from 0.512 to 0.496)."""


def vague_words() -> frozenset[str]:
    """``STOP_WORDS`` and every English word too common to tell a fault ("something", "please",
    "take"): what the too-little-text check does not count."""
    return _VAGUE


_VAGUE = STOP_WORDS | ENGLISH_STOP_WORDS

IDEOGRAPHS = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af]")
"""Kana, CJK ideographs and Hangul: scripts written without spaces between words."""
_WORD = re.compile(r"\w[\w.\-]*\w")


def tokenize(text: str) -> list[str]:
    """The tokens of the text without stop words."""
    return [t for t in _TOKEN.findall(text.lower()) if t not in STOP_WORDS]


def content_words(text: str) -> set[str]:
    """Distinct words of three or more characters that are not vague words, in any alphabet
    (``nvidia-smi`` and ``libnccl.so`` count as one word each); text in a script without spaces
    counts a word per two characters."""
    lowered, stop = text.lower(), vague_words()
    words = {w for w in _WORD.findall(lowered) if len(w) >= 3 and w not in stop and not IDEOGRAPHS.search(w)}
    ideographs = IDEOGRAPHS.findall(lowered)
    return words | {"".join(ideographs[n:n + 2]) for n in range(0, len(ideographs), 2)}
