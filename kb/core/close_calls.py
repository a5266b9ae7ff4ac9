"""Close calls: the one question that decides between two root causes the engine cannot tell apart.

When the prediction is split between two causes (often in different dimensions, so the fix has
different owners), the on-call engineer is shown a question they can answer in minutes on the
cluster, and what each answer points to. The pairs are data (``data/close_calls.yaml`` by
default); a team with its own taxonomy or its own recurring close calls points the setting at its
own file. Every cause a file names must be a cause of the taxonomy it is loaded against.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, StringConstraints, ValidationError, field_validator, model_validator

from kb.core.taxonomy import Taxonomy, read_yaml

Text = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1)]
"""A non-empty string (surrounding whitespace dropped)."""


class CloseCallsError(ValueError):
    """A close-calls file that cannot be used; the message names the file, the entry and the problem."""


class CloseCall(BaseModel):
    """Two causes that are easily confused, and the question whose answer picks one of them."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    causes: tuple[Text, Text]  # two different root-cause ids, in no particular order
    question: Text  # what to check, answerable in minutes on the cluster
    answers: dict[str, Text]  # for each of the two causes, the answer that points to it
    # For a cause of the pair, the ticket readings ("scope:many_users", "change:platform_change")
    # that already give its answer; the engine weighs each by how often it held in the knowledge base.
    settled_by: dict[str, list[Annotated[str, StringConstraints(pattern=r"^[a-z]+:[a-z][a-z0-9_]*$")]]] = {}

    @field_validator("causes", mode="before")
    @classmethod
    def _a_list_of_two(cls, value: object) -> object:
        if not isinstance(value, list | tuple) or len(value) != 2:
            raise ValueError(f"must be a list of two root-cause ids, not {value!r}")
        return value

    @model_validator(mode="after")
    def _two_causes_each_answered(self) -> CloseCall:
        first, second = self.causes
        if first == second:
            raise ValueError(f"names the same cause twice ({first!r}); a close call is between two causes")
        if set(self.answers) != {first, second}:
            raise ValueError(f"answers must name exactly the causes {first!r} and {second!r}, "
                             f"not {', '.join(repr(a) for a in self.answers) or 'none'}")
        if not set(self.settled_by) <= {first, second}:
            raise ValueError(f"settled_by may name only the causes {first!r} and {second!r}, "
                             f"not {', '.join(repr(a) for a in set(self.settled_by) - {first, second})}")
        overlap = set(self.settled_by.get(first, [])) & set(self.settled_by.get(second, []))
        if overlap:
            raise ValueError(f"settled_by gives {', '.join(sorted(overlap))} as the answer for both causes")
        return self

    @property
    def pair(self) -> frozenset[str]:
        """The two causes as an unordered pair."""
        return frozenset(self.causes)

    def answer_for(self, cause_id: str) -> str:
        """The answer that points to this cause (KeyError for a cause outside the pair)."""
        return self.answers[cause_id]


class CloseCalls(BaseModel):
    """All close calls of one file, looked up by their pair of causes in either order."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    entries: list[CloseCall]

    def question_for(self, first: str, second: str) -> CloseCall | None:
        """The close call between these two causes, in either order; None when the file has none."""
        pair = frozenset((first, second))
        return next((entry for entry in self.entries if entry.pair == pair), None)

    def __len__(self) -> int:
        return len(self.entries)


def load_close_calls(path: Path | str, taxonomy: Taxonomy) -> CloseCalls:
    """Load and validate a close-calls file against a taxonomy; raises CloseCallsError naming the entry."""
    path = Path(path)
    raw = _read_list(path)
    known = set(taxonomy.cause_ids)
    entries: list[CloseCall] = []
    seen: dict[frozenset[str], int] = {}
    for number, item in enumerate(raw, start=1):
        where = f"{path}: entry {number}"
        if not isinstance(item, dict):
            raise CloseCallsError(f"{where}: expected a mapping with causes, question and answers")
        try:
            entry = CloseCall.model_validate(item)
        except ValidationError as exc:
            raise CloseCallsError(f"{where}: {_describe(exc)}") from exc
        unknown = [c for c in entry.causes if c not in known]
        if unknown:
            raise CloseCallsError(f"{where}: unknown root cause {', '.join(map(repr, unknown))}; "
                                  f"the taxonomy {taxonomy.name!r} defines: {', '.join(taxonomy.cause_ids)}")
        if entry.pair in seen:
            raise CloseCallsError(f"{where}: duplicate pair {' / '.join(sorted(entry.pair))}, "
                                  f"already given as entry {seen[entry.pair]} (in either order)")
        seen[entry.pair] = number
        entries.append(entry)
    return CloseCalls(entries=entries)


def _read_list(path: Path) -> list:
    return read_yaml(path, list, "a list of entries (causes, question, answers)", CloseCallsError, "PMKB_CLOSE_CALLS")


def _describe(exc: ValidationError) -> str:
    """The first problem of a failed entry, with the field it concerns."""
    first = exc.errors()[0]
    field = ".".join(str(part) for part in first["loc"])
    message = first["msg"].removeprefix("Value error, ")
    return f"{field}: {message}" if field else message
