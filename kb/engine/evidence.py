"""Evidence: log signatures an on-call engineer reads by eye, as data (data/signatures.yaml)."""

from __future__ import annotations

import re
from collections import Counter
from functools import lru_cache
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kb.core.suggestion import Evidence
from kb.core.taxonomy import LowUtilTaxonomy, Taxonomy, TaxonomyError
from kb.core.yamlsafe import load_yaml
from kb.engine.prefilter import may_match


class Signature(BaseModel):
    """One recognisable log line or phrase, mapped to categories with weights."""

    model_config = ConfigDict(extra="forbid")

    id: str
    pattern: str  # Python regex, compiled case-insensitive and multi-line
    causes: dict[str, float] = Field(default_factory=dict)  # root-cause id -> weight (0, 3]
    symptoms: dict[str, float] = Field(default_factory=dict)  # symptom id -> weight
    low_gpu_utilisation: str | None = None  # low-GPU-utilisation category it points to
    suspect: str | None = None  # "node" or "gpu" when the line usually identifies bad hardware
    explanation: str
    examples: list[str] = Field(default_factory=list)  # lines that must match
    counter_examples: list[str] = Field(default_factory=list)  # lines that must not match

    def compiled(self) -> re.Pattern[str]:
        """The compiled pattern."""
        return _compile(self.pattern)


@lru_cache(maxsize=1024)
def _compile(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern, re.IGNORECASE | re.MULTILINE)


def load_signatures(path: Path | str, taxonomy: Taxonomy,
                    low_util: LowUtilTaxonomy | None = None) -> list[Signature]:
    """Load and validate signatures against the taxonomy; errors name the signature."""
    return list(_load(str(path), taxonomy, low_util))


_CACHE: dict[tuple, tuple[Signature, ...]] = {}


def _load(path: str, taxonomy: Taxonomy, low_util: LowUtilTaxonomy | None) -> tuple[Signature, ...]:
    key = (path, taxonomy.name, id(taxonomy), id(low_util))
    if key in _CACHE:
        return _CACHE[key]
    try:
        raw = load_yaml(Path(path).read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise TaxonomyError(f"{path}: cannot read signatures: {exc}") from exc
    items = raw.get("signatures") if isinstance(raw, dict) else None
    if not isinstance(items, list):
        raise TaxonomyError(f"{path}: expected a top-level 'signatures:' list")
    out = []
    for number, item in enumerate(items, 1):
        name = item.get("id", f"#{number}") if isinstance(item, dict) else f"#{number}"
        try:
            sig = Signature.model_validate(item)
            sig.compiled()
        except (ValidationError, re.error) as exc:
            raise TaxonomyError(f"{path}: signature {name!r}: {exc}") from exc
        for cause, weight in sig.causes.items():
            if cause not in taxonomy.cause_ids:
                raise TaxonomyError(f"{path}: signature {name!r} names unknown root cause {cause!r}")
            if not 0 < weight <= 3:
                raise TaxonomyError(f"{path}: signature {name!r}: weight {weight} for {cause} not in (0, 3]")
        for symptom in sig.symptoms:
            if symptom not in taxonomy.symptom_ids:
                raise TaxonomyError(f"{path}: signature {name!r} names unknown symptom {symptom!r}")
        if sig.low_gpu_utilisation and low_util and sig.low_gpu_utilisation not in {
                c.id for c in low_util.categories}:
            raise TaxonomyError(f"{path}: signature {name!r} names unknown low-GPU-utilisation "
                                f"category {sig.low_gpu_utilisation!r}")
        out.append(sig)
    dupes = [i for i, n in Counter(s.id for s in out).items() if n > 1]
    if dupes:
        raise TaxonomyError(f"{path}: duplicate signature id(s): {', '.join(dupes)}")
    _CACHE[key] = tuple(out)
    return _CACHE[key]


def _line_around(text: str, start: int, end: int, width: int = 200) -> str:
    line_start = text.rfind("\n", 0, start) + 1
    line_end = text.find("\n", end)
    line_end = len(text) if line_end == -1 else line_end
    line = text[line_start:line_end].strip()
    if len(line) > width:
        rel = start - line_start
        lo = max(0, rel - width // 2)
        line = ("..." if lo else "") + line[lo:lo + width] + "..."
    return line


def find_evidence(text: str, signatures: list[Signature]) -> list[Evidence]:
    """Every signature that matches the text (first match each), strongest first."""
    found = []
    lowered = text.lower() if text.isascii() else None  # see kb/engine/prefilter.py
    for sig in signatures:
        if lowered is not None and not may_match(sig.pattern, lowered):
            continue
        match = sig.compiled().search(text)
        if not match:
            continue
        top = max(sig.causes, key=sig.causes.get) if sig.causes else None
        found.append(Evidence(signal=sig.id, text=_line_around(text, match.start(), match.end()),
                              category=top, causes=dict(sig.causes), symptoms=dict(sig.symptoms),
                              explanation=sig.explanation, start=match.start(), end=match.end(),
                              low_gpu_utilisation=sig.low_gpu_utilisation, suspect=sig.suspect))
    found.sort(key=lambda e: -max(e.causes.values(), default=0))
    return found


def evidence_scores(evidence: list[Evidence], ids: list[str], field: str = "causes",
                    cap: float = 4.0) -> dict[str, float]:
    """Summed signature weight per id (capped so one noisy ticket cannot dominate)."""
    totals = dict.fromkeys(ids, 0.0)
    for item in evidence:
        for label, weight in getattr(item, field).items():
            if label in totals:
                totals[label] += weight
    return {k: min(v, cap) for k, v in totals.items()}


_HOST = r"[a-z][a-z0-9]*(?:[-_.][a-z0-9]+)*"  # hostname-shaped: a letter first, parts joined by - _ .
_NODE_BY_KEYWORD = re.compile(  # "nfs: server X not responding" names the file server, not the node
    rf"\b(?<!nfs: )(?:nodes?|host|hostname|server|machine|worker|vm|instance)\b\s*[:=]?\s*[`'\"]?({_HOST})", re.I)
_NODE_BY_NAME = re.compile(  # naming schemes common enough to trust without a keyword
    r"\b((?:gpu|dgx|hgx|node|compute|worker|hpc|cn|gn|ip|aks|gke)[-_]?[a-z0-9]*-?\d+(?:[-_.][a-z0-9]+)*)\b", re.I)
_NODE_AFTER_ON = re.compile(rf"\bon\s+[`'\"]?({_HOST})", re.I)
_NOT_NODE = re.compile(r"""^(?:
    (?:[abhvlkpt]|gh|gb|rtx|mi)\d{2,4}[a-z]*(?:[-_](?:sxm\d*|pcie|nvl|hbm\d*e?|\d+gb?))*  # GPU models
  | gpu\d{1,2}  # a GPU index on its host
  | [a-z]\d+[a-z]*\.\d*x?large | standard_\w+ | [a-z]\d-(?:high|mega|ultra)gpu-\w+ | gpu\d\.\d+  # cloud shapes
  | mlx\d+(?:_\d+)? | ib\d+ | ibp\w+ | eth\d+ | en[opsx]\w+ | bond\d+ | hsn\d+  # network ports
  | k8s | k3s | (?:cuda|python|slurm|nccl|sm)[-_.]?[\d.]+  # platforms and versions
  | (?:worker|master|launcher|chief|ps|evaluator|trainer)[-_]\d+ | .+\.svc(?:\.cluster\.local)?  # pods
  | nvme\d+(?:n\d+)? | sd[a-z]{1,2}\d* | md\d+ | nvidia\d+  # devices on a node
)$""", re.I | re.X)
_GPU = re.compile(r"\b(?:GPU\s*#?\s*(\d{1,2})\b(?!\.\d)|gpu(\d{1,2})\b(?!\.\d)"
                  r"|PCI:?\s*(0000:[0-9a-f]{2}:[0-9a-f]{2}(?:\.\d)?))", re.I)
_CAMEL_CASE = re.compile(r"[a-z][A-Z]")  # AssignIPv4Address is an identifier, not a host


def _is_node(name: str, after: str) -> bool:
    return (any(c.isdigit() for c in name) and not _NOT_NODE.match(name) and not _CAMEL_CASE.search(name)
            and not after.lstrip("-_").startswith(("[", "...")))  # a range (a100-[01-08]) or a truncated id


def _node_names(text: str):
    """Every node name in the text, strongest rule first: after a word such as "node" or "host",
    by a common naming scheme, after "on". GPU models, instance types, NIC ports, versions and a
    job's pod replicas (worker-0) are not nodes."""
    for pattern in (_NODE_BY_KEYWORD, _NODE_BY_NAME, _NODE_AFTER_ON):
        for match in pattern.finditer(text):
            name = match.group(1).rstrip(".-_")
            if _is_node(name, text[match.end(1):match.end(1) + 3]):
                yield name


def find_node(text: str) -> str | None:
    """The node a ticket names first (see ``_node_names``), or None."""
    return next(_node_names(text), None)


def find_nodes(text: str) -> set[str]:
    """Every node a text names, in lower case (for matching incidents by node)."""
    return {name.lower() for name in _node_names(text)}


def find_suspect(text: str) -> dict[str, str] | None:
    """The node (and GPU) a ticket names, if any: where to exclude or cordon."""
    node = find_node(text)
    gpu_match = _GPU.search(text)
    gpu = next((g for g in gpu_match.groups() if g), None) if gpu_match else None
    if not node and not gpu:
        return None
    out = {}
    if node:
        out["node"] = node
    if gpu:
        out["gpu"] = gpu
    return out
