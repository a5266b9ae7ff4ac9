"""When not to label: a suggestion abstains when its top probability is under the threshold, or
when the ticket says too little for any probability to mean something ("job failed", "please take
a look"), which the card, the ticket comment and the annotation output each explain."""

from __future__ import annotations

import re

LOW_CONFIDENCE = "low_confidence"  # top root-cause probability under the abstain threshold
TOO_LITTLE_TEXT = "too_little_text"  # no log signature and too few content words to tell


IDEOGRAPHS = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af]")
"""Kana, CJK ideographs and Hangul: scripts written without spaces between words."""


def content_words(text: str) -> set[str]:
    """Distinct words of three or more characters that are not English stop words, in any
    alphabet; text in a script without spaces counts a word per two characters."""
    from sklearn.feature_extraction.text import ENGLISH_STOP_WORDS

    lowered = text.lower()
    words = {w for w in re.findall(r"\w[\w.\-]*\w", lowered)
             if len(w) >= 3 and w not in ENGLISH_STOP_WORDS and not IDEOGRAPHS.search(w)}
    ideographs = IDEOGRAPHS.findall(lowered)
    return words | {"".join(ideographs[n:n + 2]) for n in range(0, len(ideographs), 2)}


def says_too_little(text: str, has_evidence: bool, min_words: int) -> bool:
    """No log signature and fewer than ``min_words`` content words: too little to tell the cause."""
    return not has_evidence and len(content_words(text)) < min_words


def abstain_reason(confidence: float, threshold: float, too_little_text: bool) -> str | None:
    """Why a suggestion with this top probability abstains (None: it labels)."""
    if too_little_text:
        return TOO_LITTLE_TEXT
    return LOW_CONFIDENCE if confidence < threshold else None


def label_decision(confidence: float, cause_retry_safe: bool, threshold: float, too_little_text: bool) -> dict:
    """The fields of a Suggestion that follow from its shown cause and that cause's probability:
    whether it abstains and why, and whether resubmitting is safe (never when it abstains).

    The one place these are decided, for the engine and for a model's relabelling alike.
    """
    reason = abstain_reason(confidence, threshold, too_little_text)
    return {"abstained": reason is not None, "abstain_reason": reason,
            "retry_safe": cause_retry_safe and reason is None}


TOO_LITTLE_ADVICE = ("the ticket says too little to tell the cause; add the error message or log lines, "
                     "the job id and node, and what changed")
