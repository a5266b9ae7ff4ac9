"""LLM-assisted suggestion, held to the taxonomy and to the engine's probabilities.

The engine suggests first. The model then answers in a JSON schema whose ``root_cause`` and
``symptom`` are enums of the engine's top candidates and whose ``citations`` are the ids of the
incidents in its context; the answer is validated (a citation of an incident outside the
context is rejected), retried once with the reason, and otherwise dropped: the engine's
suggestion is returned with ``llm_failed: true`` in its trace.

Combination rule (``combine_choice``): the model's pick replaces the engine's top label only
when the engine's own probability for the pick is at least ``ACCEPT_FLOOR`` and within
``ACCEPT_MARGIN`` of the top probability; otherwise the engine's label stays. On a ticket
carrying instruction-like text the model never changes a label. The reported confidence is
always the engine's calibrated probability of the label shown.

What the model writes is checked like what it labels (``kb.llm.prose``): an explanation that
names another root cause or symptom than the card shows, or an incident the suggestion does not
cite or show, is not shown; the engine's explanation stays. An explanation over the length limit
or cut off mid-sentence is cut back to its last full sentence.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kb.core.abstain import TOO_LITTLE_TEXT, label_decision
from kb.core.incidents import Incident
from kb.core.redact import redact
from kb.core.roles import Suggester
from kb.core.suggestion import Candidate, Suggestion, Ticket
from kb.core.untrusted import injection_markers, neutralise, strip_instruction_lines
from kb.engine.evidence import find_evidence
from kb.engine.mitigate import rank_mitigations
from kb.engine.remediate import plan_for
from kb.engine.suggest import SuggestionEngine
from kb.llm.backends import (
    Generator,
    LLMError,
    LLMUnavailable,
    ResponseCache,
    shared_generator,
)
from kb.llm.chain import incident_document, structured_chain
from kb.llm.prompting import PromptError, cited_ids, load_prompt, trim_around_evidence
from kb.llm.prose import EXPLANATION_CHARS, check_prose, fit_explanation

CAUSE_CHOICES = 5
"""Root-cause candidates offered to the model: the engine's top five."""
SYMPTOM_CHOICES = 3
CONTEXT_INCIDENTS = 5
ACCEPT_MARGIN = 0.15
"""The model's pick must be within this much of the engine's top probability ..."""
ACCEPT_FLOOR = 0.10
"""... and have at least this engine probability, or the engine's label stays."""
ANSWER_TOKENS = 384
"""Room always kept free in the context window for the answer, so it is never cut off."""
RESOLUTION_CHARS = 300
TICKET_CHARS = 12_000


class LLMAnswer(BaseModel):
    """The model's answer; its JSON schema (with enums added) constrains generation."""

    model_config = ConfigDict(extra="forbid")

    root_cause: str  # one of the engine's root-cause candidates
    symptom: str  # one of the engine's symptom candidates
    citations: list[str] = Field(max_length=3)  # ids of context incidents that support the answer
    # Two short sentences for the on-call. The schema sent to the model limits it to
    # EXPLANATION_CHARS (answer_schema); a longer one is parsed, then cut by fit_explanation.
    explanation: str


def _first_sentence(text: str) -> str:
    end = text.find(". ")
    return text[:end + 1] if end > 0 else text


class InvalidAnswer(ValueError):
    """An answer that is not valid JSON, breaks the schema or cites outside its context."""


def answer_schema(cause_ids: list[str], symptom_ids: list[str], context_ids: list[str],
                  explanation_chars: int = EXPLANATION_CHARS) -> dict:
    """LLMAnswer's JSON schema with the candidates and context ids as enums."""
    schema = LLMAnswer.model_json_schema()
    props = schema["properties"]
    props["root_cause"]["enum"] = list(cause_ids)
    props["symptom"]["enum"] = list(symptom_ids)
    props["citations"]["items"] = {"type": "string", "enum": list(context_ids)} if context_ids else {
        "type": "string"}
    props["citations"]["maxItems"] = 3 if context_ids else 0
    # No brackets or markup in free text: citations go in their own list, where they can be checked.
    longest = min(explanation_chars, EXPLANATION_CHARS)
    props["explanation"] = {"type": "string", "pattern": r'^[^\[\]{}<>"\\\n\r\t]{1,%d}$' % longest}
    return schema


def parse_answer(raw: str, cause_ids: list[str], symptom_ids: list[str], context_ids: list[str]) -> LLMAnswer:
    """Validate a raw answer against the schema, the candidates and the context; raise InvalidAnswer."""
    text = re.sub(r"^\s*```(?:json)?\s*|\s*```\s*$", "", raw or "")
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise InvalidAnswer(f"the answer is not a JSON object ({exc.args[0]})") from exc
    try:
        answer = LLMAnswer.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'answer'}: {e['msg']}" for e in exc.errors())
        raise InvalidAnswer(f"the answer does not fit the schema ({problems})") from exc
    if answer.root_cause not in cause_ids:
        raise InvalidAnswer(f"root_cause {answer.root_cause!r} is not one of the candidates {', '.join(cause_ids)}")
    if answer.symptom not in symptom_ids:
        raise InvalidAnswer(f"symptom {answer.symptom!r} is not one of the candidates {', '.join(symptom_ids)}")
    outside = [i for i in answer.citations + cited_ids(answer.explanation) if i not in context_ids]
    if outside:
        raise InvalidAnswer(f"the answer cites {', '.join(outside)}, which is not an incident in its context "
                            f"({', '.join(context_ids) or 'none'})")
    return answer.model_copy(update={"citations": list(dict.fromkeys(answer.citations))})


def combine_choice(candidates: list[Candidate], pick: str, margin: float = ACCEPT_MARGIN,
                   floor: float = ACCEPT_FLOOR) -> tuple[str, bool, str]:
    """(label, accepted, reason): the model's pick if the engine finds it plausible enough, else the top."""
    top = candidates[0]
    p = next((c.confidence for c in candidates if c.id == pick), 0.0)
    if pick == top.id:
        return top.id, True, "agrees with the engine"
    if p >= floor and top.confidence - p <= margin:
        return pick, True, f"engine gives {pick} {p:.0%}, within {margin:.0%} of {top.id} {top.confidence:.0%}"
    return top.id, False, (f"engine gives {pick} {p:.0%} against {top.id} {top.confidence:.0%} "
                           f"(needs at least {floor:.0%} and within {margin:.0%}): kept {top.id}")


@dataclass
class _Request:
    cause_ids: list[str]
    symptom_ids: list[str]


class LLMSuggester:
    """The engine's suggestion, explained (and possibly re-ranked) by a model; a ``Suggester``."""

    def __init__(self, engine: SuggestionEngine, generator: Generator | None, cache: ResponseCache | None = None,
                 setup_error: str | None = None, answer_tokens: int = ANSWER_TOKENS,
                 context_incidents: int = CONTEXT_INCIDENTS, explanation_chars: int = EXPLANATION_CHARS):
        self.engine = engine
        self.settings = engine.settings
        self.generator = generator
        self.setup_error = setup_error
        self.answer_tokens = answer_tokens
        self.context_incidents = context_incidents
        self.explanation_chars = explanation_chars
        self.template = load_prompt("suggest")
        self.cache = cache if cache is not None else ResponseCache(self.settings.home / "llm_cache")
        self.chain = structured_chain(self._retrieve, self._prepare, generator, self.template, self._parse,
                                      self.cache, answer_tokens) if generator else None

    def _retrieve(self, state: dict) -> list:
        """Context documents: the incidents the engine retrieved for this ticket, best first."""
        return [incident_document(h) for h in state["suggestion"].similar_incidents[:self.context_incidents]]

    def _variables(self, state: dict, documents: list, text: str, spans: list[tuple[int, int]], limit: int,
                   compact: bool = False) -> dict:
        s: Suggestion = state["suggestion"]
        tax = self.engine.kb.taxonomy
        ticket = trim_around_evidence(text, spans, limit)
        causes = [{"id": c.id, "confidence_pct": f"{c.confidence:.0%}", "name": tax.root_cause(c.id).name,
                   "dimension": tax.root_cause(c.id).dimension,
                   "definition": _first_sentence(tax.root_cause(c.id).definition) if compact
                   else tax.root_cause(c.id).definition}
                  for c in s.root_cause_candidates[:CAUSE_CHOICES]]
        resolution_chars = RESOLUTION_CHARS // 2 if compact else RESOLUTION_CHARS
        symptoms = [{"id": c.id, "confidence_pct": f"{c.confidence:.0%}", "name": tax.symptom(c.id).name}
                    for c in s.symptom_candidates[:SYMPTOM_CHOICES]]
        return {"causes": causes, "symptoms": symptoms, "ticket": neutralise(ticket),
                "evidence": [{"signal": e.signal, "text": neutralise(e.text), "category": e.category}
                             for e in s.evidence[:6]],
                "incidents": [{**d.metadata, "title": neutralise(d.metadata["title"]),
                               "resolution": neutralise(d.metadata["resolution"] or "")[:resolution_chars]}
                              for d in documents],
                "retry_note": state.get("retry_note", ""), "trimmed": len(ticket) < len(text),
                "explanation_chars": self.explanation_chars}

    def _prepare(self, state: dict) -> dict:
        """Template variables that fit the context window with the answer's tokens to spare, and the schema."""
        room = self.generator.context - self.answer_tokens - 16
        documents = list(state["documents"])
        text = redact(state["ticket"].text())
        # Evidence spans in this text (the engine may have read the ticket without instruction lines).
        spans = [(e.start, e.end) for e in find_evidence(text, self.engine.signatures)]
        limit, compact = TICKET_CHARS, False
        while True:  # shrink in order: the ticket (around its evidence), definitions, context incidents
            variables = self._variables(state, documents, text, spans, limit, compact)
            used = sum(self.generator.count_tokens(m["content"]) for m in self.template.render(**variables))
            if used <= room:
                break
            if limit > 600:
                limit = max(600, int(limit * min(0.8, room / used)))
            elif not compact:
                compact = True
            elif documents:
                documents = documents[:-1]
            else:
                raise LLMError(f"the prompt needs {used} tokens, more than the {room} left for it in a "
                               f"{self.generator.context}-token context; raise PMKB_LLM_CONTEXT")
        s: Suggestion = state["suggestion"]
        context_ids = [d.metadata["id"] for d in documents]
        causes = [c.id for c in s.root_cause_candidates[:CAUSE_CHOICES]]
        symptoms = [c.id for c in s.symptom_candidates[:SYMPTOM_CHOICES]]
        return {"variables": variables,
                "schema": answer_schema(causes, symptoms, context_ids, self.explanation_chars),
                "context_ids": context_ids, "request": _Request(causes, symptoms), "prompt_tokens": used}

    def prompt_for(self, ticket: Ticket, suggestion: Suggestion) -> tuple[list[dict], int]:
        """The messages the model would get for a ticket and its engine suggestion, and their tokens."""
        state = {"ticket": ticket, "suggestion": suggestion, "retry_note": ""}
        prepared = self._prepare({**state, "documents": self._retrieve(state)})
        return self.template.render(**prepared["variables"]), prepared["prompt_tokens"]

    @staticmethod
    def _parse(raw: str, result: dict) -> LLMAnswer:
        req: _Request = result["request"]
        return parse_answer(raw, req.cause_ids, req.symptom_ids, result["context_ids"])

    def _ask(self, ticket: Ticket, base: Suggestion, trace: dict) -> LLMAnswer | None:
        """Run the chain, retrying once with the reason when the answer is invalid."""
        if self.chain is None:
            trace["llm_error"] = self.setup_error or "no model configured"
            return None
        state = {"ticket": ticket, "suggestion": base, "retry_note": ""}
        for attempt in (1, 2):
            trace["llm_attempts"] = attempt
            try:
                result = self.chain.invoke(state)
            except (LLMError, PromptError) as exc:  # server down, timeout: no second try
                trace["llm_error"] = str(exc)
                return None
            trace["llm_cache"] = result["cache"]
            trace["llm_prompt_tokens"] = result["prompt_tokens"]
            trace["llm_ticket_trimmed"] = result["variables"]["trimmed"]
            if result["answer"] is not None:
                trace["llm_error"] = None
                return result["answer"]
            trace["llm_error"] = result["error"]
            state = {**state, "retry_note": neutralise(result["error"])}
        return None

    def suggest(self, ticket: Ticket | Incident, exclude: set[str] | None = None) -> Suggestion:
        """The engine's suggestion, with the model's explanation and choice applied by the rule.

        On a ticket with instruction-like text the engine classifies the ticket with the
        instructions cut out (the rest of their lines stays), and the model may explain but not
        relabel.
        """
        ticket = _as_ticket(ticket)
        return self.refine(ticket, self.engine.suggest(_engine_ticket(ticket), exclude=exclude))

    def suggest_batch(self, tickets: list[Ticket | Incident],
                      exclude: set[str] | None = None) -> list[Suggestion | Exception]:
        """The engine's batched suggestions, each refined by the model (a failure stays in its place)."""
        tickets = [_as_ticket(t) for t in tickets]
        out: list[Suggestion | Exception] = []
        for ticket, base in zip(tickets, self.engine.suggest_batch([_engine_ticket(t) for t in tickets],
                                                                   exclude=exclude)):
            try:
                out.append(base if isinstance(base, Exception) else self.refine(ticket, base))
            except Exception as exc:  # noqa: BLE001 - reported per ticket, as the engine does
                out.append(exc)
        return out

    def refine(self, ticket: Ticket | Incident, suggestion: Suggestion) -> Suggestion:
        """An engine suggestion already made for this ticket, with the model's answer applied.

        The engine's work is reused (a batch job refines the suggestions of its batch). Whatever
        goes wrong with the model, the engine's suggestion comes back with ``llm_failed: true``.
        """
        ticket = _as_ticket(ticket)
        markers = injection_markers(ticket.text())
        removed = without_instruction_lines(ticket)[1] if markers else 0
        trace = {**suggestion.trace, "llm": self._model(), "prompt": self.template.record(),
                 "llm_failed": False, "llm_choice": None, "llm_prose": None, "llm_cache": None,
                 "llm_error": None, "llm_attempts": 0, "injection_suspected": markers,
                 "instruction_lines_removed": removed}
        answer = self._ask(ticket, suggestion, trace)
        if answer is None:
            trace["llm_failed"] = True
            return suggestion.model_copy(update={"trace": trace})
        return self.apply_answer(suggestion, answer, markers, trace)

    def describe(self) -> dict:
        """The engine's description, with the model (or why there is none) and the prompt template."""
        return {**self.engine.describe(), "llm": self._model(), "prompt": self.template.record()}

    def _model(self) -> dict:
        if self.generator is not None:
            return self.generator.describe()
        return {"backend": self.settings.llm, "model": self.settings.llm_model or "default",
                "error": self.setup_error or "no model configured"}

    def apply_answer(self, base: Suggestion, answer: LLMAnswer, markers: list[str], trace: dict) -> Suggestion:
        """The engine's suggestion with a valid answer applied by the combination rule (see module doc)."""
        cause, cause_ok, cause_why = combine_choice(base.root_cause_candidates, answer.root_cause)
        symptom, symptom_ok, symptom_why = combine_choice(base.symptom_candidates, answer.symptom)
        if markers:
            cause, symptom = base.root_cause, base.symptom
            cause_ok, symptom_ok = answer.root_cause == cause, answer.symptom == symptom
            cause_why = symptom_why = (f"ticket contains instruction-like text ({', '.join(markers)}): "
                                       "labels stay the engine's")
        trace["llm_choice"] = {"root_cause": answer.root_cause, "symptom": answer.symptom,
                               "citations": answer.citations, "root_cause_accepted": cause_ok,
                               "symptom_accepted": symptom_ok, "root_cause_rule": cause_why,
                               "symptom_rule": symptom_why, "explanation": answer.explanation}
        update: dict = {}
        if cause != base.root_cause:
            update.update(self._relabel(base, cause))
        if symptom != base.symptom:
            update.update(symptom=symptom, symptom_confidence=next(
                c.confidence for c in base.symptom_candidates if c.id == symptom))
        shown = base.model_copy(update=update)
        if cause != base.root_cause and self.settings.scheduler:  # the plan follows the cause shown
            shown.remediation = plan_for(shown, self.settings.scheduler,
                                         job=base.remediation.job if base.remediation else None)
        update["remediation"] = shown.remediation
        text, fit = fit_explanation(answer.explanation, self.explanation_chars)
        trace["llm_explanation_fit"] = fit
        if not cause_ok:
            trace["llm_prose"] = f"rejected: it explains {answer.root_cause}, but the card shows {cause}"
        elif text is None:
            trace["llm_prose"] = fit
        elif (problem := check_prose(text, shown, self.engine.kb.taxonomy, self._incident_ids(),
                                     answer.citations)) is not None:
            trace["llm_prose"] = f"rejected: {problem}"
        else:
            trace["llm_prose"] = "accepted"
            sources = f" (see {', '.join(f'[{i}]' for i in answer.citations)})" if answer.citations else ""
            update["explanation"] = text + sources
        return base.model_copy(update={**update, "trace": trace})

    def _incident_ids(self) -> set[str]:
        """Ids of the incidents the engine retrieves from (the ids prose could name)."""
        return {i.id for i in self.engine.retriever.incidents()}

    def _relabel(self, base: Suggestion, cause_id: str) -> dict:
        """Fields that follow the root cause: name, dimension, confidence, abstention, mitigations."""
        cause = self.engine.kb.taxonomy.root_cause(cause_id)
        p = next(c.confidence for c in base.root_cause_candidates if c.id == cause_id)
        decision = label_decision(p, cause.retry_safe, self.settings.abstain_threshold,
                                  base.abstain_reason == TOO_LITTLE_TEXT)
        top = base.root_cause_candidates[0].confidence
        # Mitigations follow the accepted cause: it takes the top probability for the ranking.
        probs = [(c.id, top if c.id == cause_id else p if c.id == base.root_cause else c.confidence)
                 for c in base.root_cause_candidates]
        steps = rank_mitigations(self.engine.kb.taxonomy, probs, base.similar_incidents, base.suspect,
                                 self.engine.usual_mitigations())[:4]
        return {"root_cause": cause_id, "root_cause_name": cause.name, "root_cause_dimension": cause.dimension,
                "root_cause_confidence": p, **decision,
                "mitigations": steps or base.mitigations, "mitigation": steps[0].id if steps else base.mitigation}


def without_instruction_lines(ticket: Ticket) -> tuple[Ticket, int]:
    """The ticket with its instruction-like text cut out, and how many lines lost some (unchanged if
    nothing would be left)."""
    parts = {name: strip_instruction_lines(getattr(ticket, name)) for name in ("title", "description", "log")}
    stripped = ticket.model_copy(update={name: text for name, (text, _) in parts.items()})
    if not stripped.text().strip():
        return ticket, 0
    return stripped, sum(n for _, n in parts.values())


def _as_ticket(ticket: Ticket | Incident) -> Ticket:
    if isinstance(ticket, Ticket):
        return ticket
    return Ticket(id=ticket.id, title=ticket.title, description=ticket.description)


def _engine_ticket(ticket: Ticket) -> Ticket:
    """What the engine classifies: the ticket without its instruction-like text, if it has any."""
    return without_instruction_lines(ticket)[0] if injection_markers(ticket.text()) else ticket


def make_suggester(engine: SuggestionEngine) -> Suggester:
    """The suggester every shell uses: the engine itself when ``settings.llm`` is ``none``, else the
    LLM-assisted suggester over it (built from the engine's settings)."""
    if engine.settings.llm == "none":
        return engine
    try:
        generator, error = shared_generator(engine.settings), None
    except LLMUnavailable as exc:
        generator, error = None, str(exc)
    return LLMSuggester(engine, generator, setup_error=error)
