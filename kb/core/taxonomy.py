"""The label space as data: symptoms, root-cause categories, mitigations.

Loaded from a YAML file (``data/taxonomy.yaml`` by default) and validated so that a
broken custom taxonomy fails at load time with the offending entry named. What the engine does
differently for some labels (look for the suspect node, name it in a step, add the
low-GPU-utilisation hints, call a cause safe to retry) is a flag on the entry, never its id, so a
team's own taxonomy with other ids keeps every feature; ``Taxonomy.missing_features`` says which
features a file turns off by flagging nothing.
"""

from __future__ import annotations

import logging
from collections import Counter
from functools import lru_cache
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kb.core.yamlsafe import load_yaml

log = logging.getLogger(__name__)

BadgeColour = Literal["red", "orange", "yellow", "green", "blue", "violet", "gray", "grey", "primary"]
"""Colours a dimension's badge can take on the chat page (Streamlit's badge colours)."""


class TaxonomyError(ValueError):
    """A taxonomy file that cannot be used; the message names the file and the entry."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Source(_Strict):
    """A publication that figures in the taxonomy come from."""

    id: str
    citation: str


class Dimension(_Strict):
    """Who owns the broken thing: hardware, platform or user."""

    id: str
    name: str
    description: str = ""
    share: float | None = None  # published share of issues, where a source gives one
    source: str | None = None
    # Its causes are faults of a machine: the engine looks in the ticket for the node and GPU to suspect.
    suspect_node: bool = False
    colour: BadgeColour = "gray"  # the badge colour of its causes on the chat page


class Symptom(_Strict):
    """What the ticket reports (job crash, hang, slowdown ...)."""

    id: str
    name: str
    definition: str
    indicators: list[str] = Field(default_factory=list)  # phrases typical of such tickets
    # Jobs run slow or leave GPUs idle: tickets with it get the low-GPU-utilisation hints.
    low_gpu_utilisation: bool = False


class Mitigation(_Strict):
    """What the on-call or the user does to mitigate an incident."""

    id: str
    name: str
    definition: str
    next_step: str  # a concrete instruction shown to the on-call
    # It keeps the job off a suspect node (exclude it, drain it): its next step names the node.
    excludes_node: bool = False
    share: float | None = None
    source: str | None = None


class RootCause(_Strict):
    """A root-cause category, with its dimension and default mitigations."""

    id: str
    name: str
    dimension: str
    group: str
    definition: str
    typical_evidence: list[str] = Field(default_factory=list)
    default_mitigations: list[str]  # ranked mitigation ids
    retry_safe: bool = False  # would a resubmission (excluding the suspect node) likely clear it?
    share: float | None = None
    source: str | None = None

    def document(self) -> str:
        """Text that represents the category in the vector store."""
        evidence = "; ".join(self.typical_evidence)
        return f"{self.name}. {self.definition} Typical evidence: {evidence}"


class Interruption(_Strict):
    """A published interruption count (e.g. Llama 3 training) mapped to a category."""

    cause: str
    count: int
    maps_to: str | None = None  # None where the publication names no cause
    source: str | None = None
    note: str | None = None


class Taxonomy(_Strict):
    """The whole label space, validated for internal consistency."""

    name: str
    version: int | str = 1
    sources: list[Source] = Field(default_factory=list)
    labelling_rules: list[str] = Field(default_factory=list)
    dimensions: list[Dimension]
    symptoms: list[Symptom]
    mitigations: list[Mitigation]
    root_causes: list[RootCause]
    published_interruptions: list[Interruption] = Field(default_factory=list)

    def root_cause(self, cause_id: str) -> RootCause:
        """The root-cause category with this id (KeyError naming the known ids otherwise)."""
        return _index(self.root_causes, cause_id, "root cause")

    def symptom(self, symptom_id: str) -> Symptom:
        """The symptom with this id."""
        return _index(self.symptoms, symptom_id, "symptom")

    def mitigation(self, mitigation_id: str) -> Mitigation:
        """The mitigation with this id."""
        return _index(self.mitigations, mitigation_id, "mitigation")

    def dimension_of(self, cause_id: str) -> str:
        """The dimension a root-cause category belongs to."""
        return self.root_cause(cause_id).dimension

    @property
    def cause_ids(self) -> list[str]:
        """Root-cause ids in file order."""
        return [c.id for c in self.root_causes]

    @property
    def symptom_ids(self) -> list[str]:
        """Symptom ids in file order."""
        return [s.id for s in self.symptoms]

    @property
    def mitigation_ids(self) -> list[str]:
        """Mitigation ids in file order."""
        return [m.id for m in self.mitigations]

    @property
    def low_utilisation_symptoms(self) -> set[str]:
        """Symptoms flagged ``low_gpu_utilisation``: their tickets get the low-GPU-utilisation hints."""
        return {s.id for s in self.symptoms if s.low_gpu_utilisation}

    @property
    def node_exclusion_mitigations(self) -> set[str]:
        """Mitigations flagged ``excludes_node``: their next step names the suspect node."""
        return {m.id for m in self.mitigations if m.excludes_node}

    @property
    def suspect_node_dimensions(self) -> set[str]:
        """Dimensions flagged ``suspect_node``: faults of a machine, whose node the ticket may name."""
        return {d.id for d in self.dimensions if d.suspect_node}

    @property
    def suspect_node_causes(self) -> set[str]:
        """Root causes in a ``suspect_node`` dimension: for them the engine looks for the suspect node."""
        dims = self.suspect_node_dimensions
        return {c.id for c in self.root_causes if c.dimension in dims}

    @property
    def retry_safe_causes(self) -> set[str]:
        """Root causes flagged ``retry_safe``."""
        return {c.id for c in self.root_causes if c.retry_safe}

    def dimension_colour(self, dimension_id: str | None) -> str:
        """The badge colour of a dimension ("gray" for one the taxonomy does not define)."""
        return next((d.colour for d in self.dimensions if d.id == dimension_id), "gray")

    def missing_features(self) -> list[str]:
        """The features this taxonomy turns off because no entry carries their flag."""
        flags = ((self.suspect_node_dimensions, "no dimension has suspect_node: true, so the suspect node "
                  "is never looked for unless a log signature points to one"),
                 (self.node_exclusion_mitigations, "no mitigation has excludes_node: true, so no next step "
                  "names the suspect node"),
                 (self.low_utilisation_symptoms, "no symptom has low_gpu_utilisation: true, so only log "
                  "signatures bring the low-GPU-utilisation hints"),
                 (self.retry_safe_causes, "no root cause has retry_safe: true, so no suggestion is "
                  "called safe to retry"))
        return [message for flagged, message in flags if not flagged]


class LowUtilCategory(_Strict):
    """A category of the low-GPU-utilisation taxonomy, with its fix."""

    id: str
    name: str
    dimension: str
    count: int
    definition: str
    indicators: list[str] = Field(default_factory=list)
    fix: str


class LowUtilTaxonomy(_Strict):
    """Finer taxonomy for slowdown and idle-GPU tickets."""

    name: str
    source: str
    dimensions: list[str]
    categories: list[LowUtilCategory]
    findings: list[str] = Field(default_factory=list)

    def category(self, category_id: str) -> LowUtilCategory:
        """The category with this id."""
        return _index(self.categories, category_id, "low-GPU-utilisation category")


def _index(items, item_id, kind):
    for item in items:
        if item.id == item_id:
            return item
    raise KeyError(f"unknown {kind} {item_id!r}; known: {', '.join(i.id for i in items)}")


def read_yaml(path: Path, expected: type = dict, shape: str = "a mapping", error: type[Exception] = TaxonomyError,
              setting: str = "PMKB_TAXONOMY or --taxonomy"):
    """A data file's top-level YAML value, which must be an ``expected`` (``shape`` in the message);
    ``error`` names the file and what is wrong, and for a missing file the ``setting`` that points to it."""
    try:
        raw = load_yaml(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise error(f"{path}: file not found (set {setting})") from exc
    except (UnicodeDecodeError, yaml.YAMLError) as exc:
        raise error(f"{path}: not valid UTF-8 YAML: {exc}") from exc
    if not isinstance(raw, expected):
        raise error(f"{path}: expected {shape} at the top level")
    return raw


def _check_unique(path: Path, kind: str, ids: list[str]) -> None:
    dupes = [i for i, n in Counter(ids).items() if n > 1]
    if dupes:
        raise TaxonomyError(f"{path}: duplicate {kind} id(s): {', '.join(dupes)}")


def validate_taxonomy(tax: Taxonomy, path: Path | str = "<taxonomy>") -> Taxonomy:
    """Check ids are unique and every reference (dimension, mitigation, source) is defined."""
    path = Path(path)
    for kind, items in (("dimension", tax.dimensions), ("symptom", tax.symptoms),
                        ("mitigation", tax.mitigations), ("root cause", tax.root_causes)):
        _check_unique(path, kind, [i.id for i in items])
    dims = {d.id for d in tax.dimensions}
    mits = {m.id for m in tax.mitigations}
    sources = {s.id for s in tax.sources}
    causes = {c.id for c in tax.root_causes}
    for cause in tax.root_causes:
        if cause.dimension not in dims:
            raise TaxonomyError(f"{path}: root cause {cause.id!r} has unknown dimension "
                                f"{cause.dimension!r}; defined dimensions: {', '.join(sorted(dims))}")
        if not cause.default_mitigations:
            raise TaxonomyError(f"{path}: root cause {cause.id!r} lists no default_mitigations")
        for mid in cause.default_mitigations:
            if mid not in mits:
                raise TaxonomyError(f"{path}: root cause {cause.id!r} names mitigation {mid!r}, "
                                    f"which is not defined under mitigations")
    for entry in [*tax.dimensions, *tax.mitigations, *tax.root_causes]:
        if entry.source is not None and sources and entry.source not in sources:
            raise TaxonomyError(f"{path}: {entry.id!r} cites unknown source {entry.source!r}")
    for item in tax.published_interruptions:
        if item.maps_to is not None and item.maps_to not in causes:
            raise TaxonomyError(f"{path}: published interruption {item.cause!r} maps to "
                                f"unknown root cause {item.maps_to!r}")
    return tax


def parse_taxonomy(raw: dict, path: Path | str = "<taxonomy>") -> Taxonomy:
    """Validate a taxonomy given as a mapping (as read from YAML)."""
    try:
        tax = Taxonomy.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = _locate(raw, first["loc"])
        raise TaxonomyError(f"{path}: invalid entry {where}: {first['msg']}") from exc
    return validate_taxonomy(tax, path)


def _locate(raw: dict, loc: tuple) -> str:
    """Describe a pydantic error location by the entry's id where there is one."""
    node, parts = raw, []
    for key in loc:
        try:
            node = node[key]
        except (KeyError, IndexError, TypeError):
            parts.append(str(key))
            continue
        if isinstance(node, dict) and "id" in node:
            parts.append(f"{node['id']!r}")
        else:
            parts.append(str(key))
    return " > ".join(parts)


@lru_cache(maxsize=8)
def load_taxonomy(path: Path | str) -> Taxonomy:
    """Load and validate a taxonomy file; raises TaxonomyError naming the bad entry.

    A file that flags no entry for a feature loads, with a warning naming the feature it turns off.
    """
    tax = parse_taxonomy(read_yaml(Path(path)), path)
    for message in tax.missing_features():
        log.warning("%s: %s", path, message)
    return tax


@lru_cache(maxsize=8)
def load_low_util_taxonomy(path: Path | str) -> LowUtilTaxonomy:
    """Load and validate the low-GPU-utilisation taxonomy file."""
    raw = read_yaml(Path(path))
    try:
        tax = LowUtilTaxonomy.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise TaxonomyError(f"{path}: invalid entry {_locate(raw, first['loc'])}: {first['msg']}") from exc
    _check_unique(Path(path), "category", [c.id for c in tax.categories])
    for cat in tax.categories:
        if cat.dimension not in tax.dimensions:
            raise TaxonomyError(f"{path}: category {cat.id!r} has unknown dimension {cat.dimension!r}")
    return tax
