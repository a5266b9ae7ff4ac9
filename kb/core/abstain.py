"""When not to label: a suggestion abstains when its top probability is under the threshold, or
when the ticket says too little for any probability to mean something ("job failed", "please take
a look"), which the card, the ticket comment and the annotation output each explain."""

from __future__ import annotations

from kb.core.text import content_words

LOW_CONFIDENCE = "low_confidence"  # top root-cause probability under the abstain threshold
TOO_LITTLE_TEXT = "too_little_text"  # no log signature and too few content words to tell


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
