"""``pmkb nccl PATH...``: from a failed job's logs, the rank, node and collective that never arrived.

Reads one file per rank, a directory, a Slurm output with every rank interleaved, a tarball or
PyTorch flight-recorder dumps; needs no knowledge base and imports nothing heavy.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer


def render_verdict(verdict) -> str:
    """The verdict as an on-call engineer reads it: the collective, the rank groups, the suspects,
    the verdict and the lines that show it."""
    lines = [f"verdict: {verdict.kind.replace('_', ' ')}: {verdict.summary}"]
    if verdict.sequence or verdict.collective:
        lines.append(f"collective: {verdict.collective or '?'} #{verdict.sequence or '?'}"
                     + (f" of {verdict.world_size} ranks" if verdict.world_size else ""))
    if verdict.dimension or verdict.causes:
        lines.append(f"points to: {verdict.dimension or 'fabric or platform'} ({', '.join(verdict.causes)}); "
                     f"retry safe: {'yes' if verdict.retry_safe else 'no'}"
                     + (f", without {', '.join(verdict.suspect_hosts)}" if verdict.retry_safe and
                        verdict.suspect_hosts else ""))
    if verdict.groups:
        lines.append("ranks by last state:")
        for group in verdict.groups:
            hosts = f" on {', '.join(group.hosts[:6])}" if group.hosts else ""
            label = "healthy (dominant)" if group.healthy else "SUSPECT"
            lines.append(f"  {label}: {group.state}: {_ranks(group.ranks)}{hosts}")
    states = {s.rank: s for s in verdict.ranks}
    for rank in verdict.suspects[:8]:
        state = states.get(rank)
        if state is None:
            continue
        where = ", ".join(x for x in (state.host, state.gpu) if x) or "host not in the logs"
        lines.append(f"  rank {rank} ({where}): last completed "
                     f"{'#' + str(state.last_completed) if state.last_completed is not None else 'unknown'}"
                     + (f"; first error: {state.first_error}" if state.first_error else "; printed no error"))
    if verdict.evidence:
        lines.append("evidence:")
        lines.extend(f"  {line}" for line in verdict.evidence)
    lines.extend(f"note: {note}" for note in verdict.notes[:10])
    return "\n".join(lines)


def _ranks(ranks: list[int]) -> str:
    """Ranks as ranges: 0-5, 7, 9-15."""
    out, start = [], None
    for n, rank in enumerate(ranks):
        if start is None:
            start = rank
        if n + 1 == len(ranks) or ranks[n + 1] != rank + 1:
            out.append(str(start) if start == rank else f"{start}-{rank}")
            start = None
    return ", ".join(out)


def nccl(paths: list[Path] = typer.Argument(..., help="The job's logs: files (one per rank, or a Slurm output "
                                                      "with every rank), directories, tarballs, flight-recorder "
                                                      "dumps"),
         as_json: bool = typer.Option(False, "--json", help="Print the verdict as JSON")) -> None:
    """Find the rank, node and collective a collective timeout waited for, from the ranks' logs."""
    from kb.core.collective_logs import read_job
    from kb.core.collective_triage import triage
    from kb.core.rank_logs import RankLogError, read_sources
    from pmkb.cli import fail

    try:
        verdict = triage(read_job(read_sources(paths)))
    except RankLogError as exc:
        fail(str(exc))
    typer.echo(json.dumps(verdict.model_dump(), indent=2) if as_json else render_verdict(verdict))
    if verdict.kind == "undetermined":
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    """Add ``pmkb nccl`` to the app."""
    app.command()(nccl)
