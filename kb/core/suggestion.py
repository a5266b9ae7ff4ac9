"""What a suggestion is: the ticket that comes in, the Suggestion that goes out, and its summary."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field, field_validator

from kb.core.abstain import TOO_LITTLE_ADVICE, TOO_LITTLE_TEXT
from kb.core.collective_triage import CollectiveVerdict
from kb.core.readings import Reading
from kb.core.remediation import RemediationPlan


class Evidence(BaseModel):
    """A signature found in a ticket: where, what it says and what it points to."""

    model_config = ConfigDict(extra="forbid")

    signal: str  # signature id
    text: str  # the matched line, shortened
    category: str | None  # the root cause it points to most strongly
    causes: dict[str, float]
    symptoms: dict[str, float] = Field(default_factory=dict)
    explanation: str
    start: int  # span of the match in the ticket text, for highlighting
    end: int
    low_gpu_utilisation: str | None = None
    suspect: str | None = None

    @property
    def points_to(self) -> str:
        """What the signature points to, for display: its root cause, else its strongest symptom."""
        if self.category:
            return self.category
        if self.symptoms:
            return "symptom " + max(self.symptoms, key=self.symptoms.get)
        return "-"


class SimilarIncident(BaseModel):
    """A past incident retrieved for a ticket."""

    model_config = ConfigDict(extra="forbid")

    id: str
    title: str
    score: float  # fused similarity in [0, 1]
    dense: float  # cosine similarity of the embeddings
    lexical: float  # BM25 score normalised by the best match
    symptom: str | None
    root_cause: str | None
    root_cause_dimension: str | None
    mitigation: str | None
    resolution: str
    provenance: str
    source: str


class MitigationStep(BaseModel):
    """A mitigation with its score and the concrete next step for this ticket."""

    model_config = ConfigDict(extra="forbid")

    id: str
    confidence: float
    next_step: str
    from_incidents: list[str] = []  # similar incidents resolved this way


class LowUtilisationHint(BaseModel):
    """A low-GPU-utilisation category that fits a slowdown or idle-GPU ticket, with its fix."""

    model_config = ConfigDict(extra="forbid")

    id: str
    name: str
    fix: str
    signal: str | None = None  # the evidence that pointed to it, if any


class NodeIncident(BaseModel):
    """An earlier incident that names the node."""

    model_config = ConfigDict(extra="forbid")

    id: str
    title: str
    created_at: datetime | None = None
    root_cause: str | None = None
    mitigation: str | None = None
    provenance: str = "human_labelled"


class NodeHistory(BaseModel):
    """How often the suspect node appears in earlier incidents, and the latest of them."""

    model_config = ConfigDict(extra="forbid")

    node: str
    total: int  # earlier incidents naming the node
    incidents: list[NodeIncident]  # the latest SHOWN of them, newest first (undated last)

    def summary(self) -> str:
        """One line for cards and comments."""
        plural = "incident" if self.total == 1 else "incidents"
        latest = ", ".join(f"{i.id} ({i.root_cause or 'unlabelled'}"
                           + (f", {i.created_at:%Y-%m-%d}" if i.created_at else "") + ")" for i in self.incidents)
        return f"{self.node} appears in {self.total} earlier {plural}: {latest}"



class EmptyTicket(ValueError):
    """A ticket with no text to work on."""


class Ticket(BaseModel):
    """A new ticket as it arrives: the only input of a suggestion (labels are never read)."""

    model_config = ConfigDict(extra="ignore")

    id: str = "ticket"
    title: str = ""
    description: str = ""
    log: str = ""  # optional log excerpt pasted by the reporter
    # The engineer's answer to the suggestion's close-call question: the cause the answer points to.
    close_call_answer: str | None = None

    @field_validator("id", mode="before")
    @classmethod
    def _id_to_str(cls, value):
        return str(value)

    def text(self) -> str:
        """Title, description and log as one text."""
        return "\n".join(p for p in (self.title, self.description, self.log) if p and p.strip())


class Candidate(BaseModel):
    """A label with its probability."""

    model_config = ConfigDict(extra="forbid")

    id: str
    confidence: float
    dimension: str | None = None  # a root cause's dimension, in prediction sets


class Owner(BaseModel):
    """Who owns the ticket: the dimension of the suggested cause, with its probability (the sum of
    its causes'), and whether that is sure enough for the bot to label it."""

    model_config = ConfigDict(extra="forbid")

    dimension: str
    confidence: float
    labelled: bool = False  # at or above the threshold fitted for ``precision`` (settings.owner_precision)
    precision: float | None = None  # the precision its labelling threshold was fitted for; None: not fitted

    def describe(self) -> str:
        """One line: the owner, its probability and whether it is sure enough to label."""
        sure = f", sure enough to label (right {self.precision:.0%} of the time at this probability)"
        return f"owner: {self.dimension} {self.confidence:.0%}" + (sure if self.labelled and self.precision else "")


class CloseCallQuestion(BaseModel):
    """The question whose answer decides between two causes of a prediction set."""

    model_config = ConfigDict(extra="forbid")

    causes: list[str]  # the two causes, the engine's more likely first
    question: str
    answers: dict[str, str]  # cause -> the answer that points to it
    answered: str | None = None  # the cause the engineer's answer points to, once answered on the page
    ticket_points_to: str | None = None  # the cause the ticket's own words point to (a hint: it stays open)
    ticket_says: Reading | None = None  # the reading, with the words, that points there


class Suggestion(BaseModel):
    """What pmkb suggests for a ticket, with the evidence behind each part."""

    model_config = ConfigDict(extra="forbid")

    id: str  # the ticket's id
    symptom: str
    symptom_confidence: float
    symptom_candidates: list[Candidate]
    root_cause: str
    root_cause_name: str
    root_cause_dimension: str
    root_cause_confidence: float
    root_cause_candidates: list[Candidate]  # ranked
    # The smallest set of causes (and of symptoms) that holds the true one with probability
    # set_level (split conformal, kb/engine/conformal.py); empty when the calibration has none.
    root_cause_set: list[Candidate] = Field(default_factory=list)
    symptom_set: list[Candidate] = Field(default_factory=list)
    set_level: float | None = None
    # The cause set at label_level, which labels follow when the team set a labelling level of its
    # own (settings.label_alpha); None: labels follow root_cause_set.
    label_set: list[Candidate] | None = None
    label_level: float | None = None
    close_call: CloseCallQuestion | None = None  # the question that decides between the set's top two causes
    owner: Owner | None = None  # the dimension that owns the ticket (kb/engine/owner.py)
    readings: list[Reading] = Field(default_factory=list)  # scope and change read from the ticket, with their words
    abstained: bool  # not sure enough to label: see abstain_reason
    abstain_reason: str | None = None  # LOW_CONFIDENCE or TOO_LITTLE_TEXT when abstained
    mitigation: str  # first of the ranked mitigations
    mitigations: list[MitigationStep]
    retry_safe: bool  # would resubmitting (excluding the suspect node) likely clear it?
    suspect: dict[str, str] | None = None  # node / GPU named in the ticket
    node_history: NodeHistory | None = None  # earlier incidents of this cluster naming the suspect node
    # The ranks' logs in the ticket read as a collective timeout: which ranks never arrived, on which
    # hosts, and the verdict that the suspect node, the dimension and retry-safe follow (``pmkb nccl``).
    collective: CollectiveVerdict | None = None
    # Take the suspect node out and resubmit without it, for the cluster's scheduler (PMKB_SCHEDULER);
    # None when not retry-safe, no node is named or no scheduler is set.
    remediation: RemediationPlan | None = None
    similar_incidents: list[SimilarIncident]
    evidence: list[Evidence]
    low_gpu_utilisation: list[LowUtilisationHint] = Field(default_factory=list)
    explanation: str = ""  # short, human-readable reasoning
    trace: dict = Field(default_factory=dict)  # engine, model, template and timing details


def explain(s: Suggestion) -> str:
    """A short paragraph saying why the engine suggests what it does."""
    parts = []
    if s.abstain_reason == TOO_LITTLE_TEXT:
        parts.append(f"Not sure: {TOO_LITTLE_ADVICE} (best guess {s.root_cause} at "
                     f"{s.root_cause_confidence:.0%}).")
    elif s.abstained:
        parts.append(f"Not sure: the best guess is {s.root_cause} at {s.root_cause_confidence:.0%}, "
                     "below the abstain threshold.")
    else:
        parts.append(f"Most likely {s.root_cause} ({s.root_cause_dimension}) at {s.root_cause_confidence:.0%}.")
    if s.owner is not None:
        parts.append(f"Owner: {s.owner.dimension} at {s.owner.confidence:.0%}"
                     + (", sure enough to route." if s.owner.labelled else "."))
    pointing = [r for r in s.readings if r.points_to and r.confidence >= 0.5]
    if pointing:
        parts.append(" ".join(f"{r.kind.capitalize()}: {r.name} -> {r.points_to}." for r in pointing))
    if s.evidence:
        parts.append("Evidence: " + "; ".join(f"{e.signal} -> {e.points_to}" for e in s.evidence[:3]) + ".")
    same = [h.id for h in s.similar_incidents if h.root_cause == s.root_cause]
    if same:
        parts.append(f"{len(same)} of {len(s.similar_incidents)} similar incidents share the cause "
                     f"({', '.join(same[:3])}).")
    if s.node_history:
        parts.append(f"{s.node_history.node} appears in {s.node_history.total} earlier "
                     f"incident{'s' if s.node_history.total > 1 else ''}.")
    if s.retry_safe:
        parts.append("A resubmission" + (f" excluding {s.suspect['node']}" if s.suspect and
                                          s.suspect.get("node") else "") + " will likely clear it.")
    return " ".join(parts)


CAUSE_LABEL, DIMENSION_LABEL, COMMENT_ONLY = "cause", "dimension", "comment"


def labelling_set(s: Suggestion) -> list[Candidate]:
    """The cause set that labels follow: the one at the labelling level when there is one, else
    the shown set."""
    return s.root_cause_set if s.label_set is None else s.label_set


def labelling(s: Suggestion) -> str:
    """What a suggestion is sure enough to label, by its prediction set (``labelling_set``): the
    cause when the set holds one cause, the dimension when every cause of the set lies in one
    dimension or the owner is sure enough (``Owner.labelled``), else nothing but a comment. Without
    a set (no set calibration) the top cause is labelled unless abstained; a ticket that says too
    little, or whose shown cause is not in the set, is never labelled."""
    if s.abstain_reason == TOO_LITTLE_TEXT:
        return COMMENT_ONLY
    members = labelling_set(s)
    if not members:
        return COMMENT_ONLY if s.abstained else CAUSE_LABEL
    if s.root_cause not in {m.id for m in members}:
        return COMMENT_ONLY  # a model moved the shown cause out of the set: a label would contradict the card
    kind = set_labelling(members)
    sure_owner = s.owner is not None and s.owner.labelled and s.owner.dimension == s.root_cause_dimension
    return DIMENSION_LABEL if kind == COMMENT_ONLY and sure_owner else kind


def set_labelling(members: list[Candidate]) -> str:
    """The labelling rule on a non-empty cause set: the cause for a set of one, the dimension for
    a set within one dimension, else a comment only."""
    if len(members) == 1:
        return CAUSE_LABEL
    return DIMENSION_LABEL if len({m.dimension for m in members}) == 1 else COMMENT_ONLY
