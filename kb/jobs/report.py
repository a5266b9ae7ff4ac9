"""The backfill report: what the old tickets were, beside the published split, in Markdown with plots.

Figures: distribution by symptom, root cause and dimension (next to the shares the taxonomy
cites), the retry-safe share, the abstained share, and the largest clusters of recurring
incidents: tickets whose closest past incident is the same one.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterable

from kb.core.taxonomy import Taxonomy
from kb.jobs.automation import AutomationFigures, Item, automation_figures
from kb.jobs.automation import render_markdown as render_automation
from kb.jobs.collective_counts import CollectiveFigures, collective_figures
from kb.jobs.collective_counts import Item as TimeoutItem
from kb.jobs.collective_counts import render_markdown as render_collectives

CLUSTER_MIN_SCORE = 0.6
"""A ticket joins the cluster of its closest past incident only when the match scores at least this."""
CONFIDENCE_BINS = 20


@dataclass
class Cluster:
    """Backfilled tickets sharing the same closest past incident."""

    anchor: str  # id of the shared closest past incident
    anchor_title: str
    size: int
    cause: str  # most common suggested root cause among the members
    cause_share: float
    examples: list[str]  # a few member ids


@dataclass
class ReportFigures:
    """The figures of a backfill report, computed from annotation records."""

    total: int = 0
    abstained: int = 0
    set_sizes: Counter = field(default_factory=Counter)  # "1", "2", "3+" causes in the prediction set
    retry_safe: int = 0
    without_precedent: int = 0  # no past incident scored CLUSTER_MIN_SCORE or more
    symptoms: Counter = field(default_factory=Counter)
    causes: Counter = field(default_factory=Counter)
    dimensions: Counter = field(default_factory=Counter)  # best guess, every ticket
    confident_dimensions: Counter = field(default_factory=Counter)  # tickets that did not abstain
    confidence_bins: list[int] = field(default_factory=lambda: [0] * CONFIDENCE_BINS)
    published: dict[str, float] = field(default_factory=dict)  # dimension -> published share
    published_source: str = ""
    clusters: list[Cluster] = field(default_factory=list)
    automation: AutomationFigures | None = None  # what automating remediation would save
    collectives: CollectiveFigures | None = None  # collective-timeout crashes per month and job size

    def share(self, count: int, of: int | None = None) -> float:
        """count / total (or / ``of``), 0 when there is nothing to divide by."""
        base = self.total if of is None else of
        return count / base if base else 0.0


def summarise(records: Iterable[dict], taxonomy: Taxonomy, min_score: float = CLUSTER_MIN_SCORE,
              top_clusters: int = 10, handling_minutes: float = 30.0) -> ReportFigures:
    """Compute the report's figures in one pass over annotation records (``annotation_record``; a
    backfilled record also carries its incident's ``labelled_mitigation`` when it had one)."""
    figures = ReportFigures()
    items: list[Item] = []
    timeouts: list[TimeoutItem] = []
    figures.published = {d.id: d.share for d in taxonomy.dimensions if d.share is not None}
    sources = {s.id: s.citation for s in taxonomy.sources}
    cited = {d.source for d in taxonomy.dimensions if d.share is not None and d.source}
    figures.published_source = "; ".join(sources.get(s, s) for s in sorted(cited))
    members: dict[str, Counter] = {}
    examples: dict[str, list[str]] = {}
    titles: dict[str, str] = {}
    for record in records:
        figures.total += 1
        figures.symptoms[record["symptom"]] += 1
        figures.causes[record["root_cause"]] += 1
        figures.dimensions[record["root_cause_dimension"]] += 1
        if record["abstained"]:
            figures.abstained += 1
        else:
            figures.confident_dimensions[record["root_cause_dimension"]] += 1
        figures.retry_safe += bool(record["retry_safe"])
        items.append(Item(bool(record["retry_safe"]) and not record["abstained"],
                          (record.get("suspect") or {}).get("node"), record.get("labelled_mitigation")))
        timeouts.append(TimeoutItem(record["symptom"], bool(record.get("collective_timeout")), record.get("job_gpus"),
                                    record.get("month")))
        size = len(record.get("root_cause_set") or [])
        if size:
            figures.set_sizes["1" if size == 1 else "2" if size == 2 else "3+"] += 1
        slot = min(int(record["root_cause_confidence"] * CONFIDENCE_BINS), CONFIDENCE_BINS - 1)
        figures.confidence_bins[slot] += 1
        similar = record.get("similar_incidents") or []
        if not similar or similar[0]["score"] < min_score:
            figures.without_precedent += 1
            continue
        anchor = similar[0]["id"]
        members.setdefault(anchor, Counter())[record["root_cause"]] += 1
        titles.setdefault(anchor, similar[0].get("title") or "")
        if len(examples.setdefault(anchor, [])) < 3:
            examples[anchor].append(record["id"])
    ranked = sorted(members.items(), key=lambda kv: (-sum(kv[1].values()), kv[0]))
    for anchor, causes in ranked[:top_clusters]:
        size = sum(causes.values())
        if size < 2:
            break
        cause, count = causes.most_common(1)[0]
        figures.clusters.append(Cluster(anchor, titles[anchor], size, cause, count / size, examples[anchor]))
    figures.automation = automation_figures(items, taxonomy.node_exclusion_mitigations, handling_minutes)
    figures.collectives = collective_figures(timeouts)
    return figures


def _pct(value: float) -> str:
    return f"{value:.1%}"


def render_markdown(figures: ReportFigures, taxonomy: Taxonomy, images: dict[str, str],
                    title: str = "Backfill report", run: dict | None = None) -> str:
    """The report as Markdown; ``images`` maps plot names to file names beside the report."""
    f = figures
    lines = [f"# {title}", "",
             f"Generated {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC from {f.total} annotated tickets "
             f"(taxonomy {taxonomy.name})."]
    if run:
        lines += ["", "This run: " + ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in run.items()) + "."]
    lines += ["", "| figure | tickets | share |", "|---|---:|---:|",
              f"| annotated | {f.total} | 100% |",
              f"| abstained (not sure: no label applied) | {f.abstained} | {_pct(f.share(f.abstained))} |",
              *(f"| prediction set of {name} | {f.set_sizes[key]} | {_pct(f.share(f.set_sizes[key]))} |"
                for key, name in (("1", "one cause (labelled)"), ("2", "two causes"), ("3+", "three or more causes"))
                if f.set_sizes),
              f"| retry-safe (automatic resubmission excluding the suspect node would have handled it) "
              f"| {f.retry_safe} | {_pct(f.share(f.retry_safe))} |",
              f"| without a close past incident (best match below {CLUSTER_MIN_SCORE}) "
              f"| {f.without_precedent} | {_pct(f.share(f.without_precedent))} |"]
    confident = f.total - f.abstained
    lines += ["", "## Root-cause dimension", "",
              "Best guess for every ticket, then only the tickets where pmkb did not abstain, beside the "
              f"published split ({f.published_source or 'no source in the taxonomy'}).", "",
              "| dimension | tickets | share | confident | share | published | difference |",
              "|---|---:|---:|---:|---:|---:|---:|"]
    for dim in taxonomy.dimensions:
        share = f.share(f.dimensions[dim.id])
        published = f.published.get(dim.id)
        lines.append(f"| {dim.id} | {f.dimensions[dim.id]} | {_pct(share)} | {f.confident_dimensions[dim.id]} | "
                     f"{_pct(f.share(f.confident_dimensions[dim.id], confident))} | "
                     f"{_pct(published) if published is not None else '-'} | "
                     f"{f'{(share - published) * 100:+.1f} pt' if published is not None else '-'} |")
    lines += _image(images, "dimensions")
    lines += ["## Symptoms", "", "| symptom | tickets | share |", "|---|---:|---:|"]
    lines += [f"| {s} | {n} | {_pct(f.share(n))} |" for s, n in f.symptoms.most_common()]
    lines += _image(images, "symptoms")
    lines += ["## Root causes", "", "| root cause | dimension | retry-safe | tickets | share |",
              "|---|---|---|---:|---:|"]
    for cause, n in f.causes.most_common():
        known = cause in taxonomy.cause_ids
        rc = taxonomy.root_cause(cause) if known else None
        lines.append(f"| {cause} | {rc.dimension if rc else '-'} | {'yes' if rc and rc.retry_safe else 'no'} "
                     f"| {n} | {_pct(f.share(n))} |")
    lines += _image(images, "root_causes")
    if f.automation is not None:
        lines += render_automation(f.automation)
    if f.collectives is not None and f.collectives.crashes:
        lines += render_collectives(f.collectives)
    lines += ["## Recurring incidents", "",
              "Tickets grouped by their closest past incident (match score at least "
              f"{CLUSTER_MIN_SCORE}); the largest groups first.", ""]
    if f.clusters:
        lines += ["| # | tickets | closest past incident | common cause | examples |", "|---:|---:|---|---|---|"]
        lines += [f"| {n} | {c.size} | {c.anchor}: {c.anchor_title.replace('|', '/')[:80]} | {c.cause} "
                  f"({_pct(c.cause_share)}) | {', '.join(c.examples)} |" for n, c in enumerate(f.clusters, 1)]
    else:
        lines.append("No past incident is the closest match of two or more tickets.")
    lines += ["", "## Confidence", "",
              "Top root-cause probability of each ticket; abstained tickets are below the threshold."]
    lines += _image(images, "confidence")
    return "\n".join(lines).rstrip() + "\n"


def _image(images: dict[str, str], name: str) -> list[str]:
    return ["", f"![{name.replace('_', ' ')}]({images[name]})", ""] if name in images else [""]


def plot_figures(figures: ReportFigures, taxonomy: Taxonomy, base: Path) -> dict[str, str]:
    """Draw the PNG plots beside ``base`` (``<base>-<name>.png``); returns name -> file name."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    f = figures
    files: dict[str, str] = {}

    def save(fig: Figure, name: str) -> None:
        FigureCanvasAgg(fig)
        fig.tight_layout()
        path = base.with_name(f"{base.name}-{name}.png")
        fig.savefig(path, dpi=100)
        files[name] = path.name

    dims = [d.id for d in taxonomy.dimensions]
    fig = Figure(figsize=(7, 4))
    ax = fig.add_subplot()
    confident = f.total - f.abstained
    series = [("backfill, best guess", [f.share(f.dimensions[d]) for d in dims]),
              ("backfill, confident", [f.share(f.confident_dimensions[d], confident) for d in dims]),
              ("published", [f.published.get(d, 0.0) for d in dims])]
    width = 0.8 / len(series)
    for n, (label, values) in enumerate(series):
        ax.bar([x + n * width for x in range(len(dims))], values, width, label=label)
    ax.set_xticks([x + width for x in range(len(dims))], dims)
    ax.set_ylabel("share of tickets")
    ax.set_title("Root-cause dimension")
    ax.legend()
    save(fig, "dimensions")
    for name, counter, heading in (("symptoms", f.symptoms, "Symptoms"), ("root_causes", f.causes, "Root causes")):
        items = counter.most_common()[::-1]
        fig = Figure(figsize=(7, 1.2 + 0.3 * max(len(items), 1)))
        ax = fig.add_subplot()
        ax.barh([k for k, _ in items], [v for _, v in items])
        ax.set_xlabel("tickets")
        ax.set_title(heading)
        save(fig, name)
    fig = Figure(figsize=(7, 3.5))
    ax = fig.add_subplot()
    ax.bar([(n + 0.5) / CONFIDENCE_BINS for n in range(CONFIDENCE_BINS)], f.confidence_bins,
           width=1 / CONFIDENCE_BINS)
    ax.set_xlabel("top root-cause probability")
    ax.set_ylabel("tickets")
    ax.set_title("Confidence")
    save(fig, "confidence")
    return files


def write_report(records: Iterable[dict], taxonomy: Taxonomy, path: Path, title: str = "Backfill report",
                 run: dict | None = None, handling_minutes: float = 30.0) -> ReportFigures:
    """Write the Markdown report to ``path`` and its PNG plots beside it; returns the figures."""
    figures = summarise(records, taxonomy, handling_minutes=handling_minutes)
    path.parent.mkdir(parents=True, exist_ok=True)
    images = plot_figures(figures, taxonomy, path.with_suffix("")) if figures.total else {}
    path.write_text(render_markdown(figures, taxonomy, images, title=title, run=run), encoding="utf-8")
    return figures


def read_records(path: Path) -> Iterable[dict]:
    """Annotation records from a JSONL output file (``pmkb backfill`` or ``pmkb annotate``), streamed."""
    import json

    with path.open(encoding="utf-8") as source:
        for line in source:
            if line.strip():
                yield json.loads(line)
