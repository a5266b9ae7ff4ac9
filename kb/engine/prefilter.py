"""Words a pattern cannot match without: a signature whose words are all absent from a ticket is
skipped without running its regex.

Python's ``re`` tries a case-insensitive alternation that starts with ``\\b`` at every position of
the text, so 241 signatures over a 1.6 MB log took 20 s. A substring test per required word takes
milliseconds. The words come from the parsed pattern: a run of literal characters that every
match contains (or, for an alternation, one run from each branch). Patterns with no such run are
always searched. The test is exact only on ASCII text, where lowering the text is the same case
folding as the regex's; other text is always searched in full.
"""

from __future__ import annotations

import re
import re._constants as _c  # the parser pmkb's Python (3.11+) compiles patterns with
import re._parser as _p
from functools import lru_cache

Need = tuple[str, ...] | None
"""Strings one of which every match contains (lower case), or None when nothing is known."""


def _better(a: Need, b: Need) -> Need:
    """The more selective of two needs: known over unknown, then the longer shortest word."""
    if a is None or b is None:
        return a if b is None else b
    return a if min(map(len, a)) >= min(map(len, b)) else b


def _need(items) -> Need:
    """What a parsed sequence needs: its best literal run or sub-item need."""
    best: Need = None
    run: list[str] = []
    for op, arg in list(items) + [(None, None)]:
        char = None
        if op == _c.LITERAL:
            char = chr(arg)
        elif op == _c.IN and len(arg) == 1 and arg[0][0] == _c.LITERAL:
            char = chr(arg[0][1])
        if char is not None:
            run.append(char)
            continue
        if run:
            best = _better(best, ("".join(run).lower(),))
            run = []
        if op == _c.SUBPATTERN:
            best = _better(best, _need(arg[-1]))
        elif op == _c.BRANCH:
            needs = [_need(branch) for branch in arg[1]]
            if all(n is not None for n in needs):
                best = _better(best, tuple(word for n in needs for word in n))
        elif op in (_c.MAX_REPEAT, _c.MIN_REPEAT, _c.POSSESSIVE_REPEAT) and arg[0] >= 1:
            best = _better(best, _need(arg[2]))
        elif op == _c.ATOMIC_GROUP:
            best = _better(best, _need(arg))
    if best is not None and not all(word.isascii() and word for word in best):
        return None  # a non-ASCII letter may fold to an ASCII one: no safe word test
    return best


@lru_cache(maxsize=1024)
def required_words(pattern: str) -> Need:
    """Words (lower case) one of which every match of ``pattern`` contains; None if unknown."""
    try:
        return _need(_p.parse(pattern, re.IGNORECASE | re.MULTILINE))
    except (re.error, TypeError, ValueError, IndexError):
        return None


def may_match(pattern: str, lowered: str) -> bool:
    """False only when ``pattern`` cannot match the ASCII text whose lower-case form is ``lowered``."""
    words = required_words(pattern)
    return words is None or any(word in lowered for word in words)
