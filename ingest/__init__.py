"""Sources -> Incident: every reader turns raw records into the one Incident type.

``read_paths`` picks the reader by file type and yields ``Parsed`` items: an Incident,
or an ``IngestError`` naming the file and line (or record) and what is wrong with it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

from kb.core.records import IngestError, IngestWarning, Parsed

__all__ = ["IngestError", "IngestWarning", "Parsed", "read_paths"]


def read_paths(paths: list[Path], csv_mapping: dict[str, str] | None = None) -> Iterator[Parsed]:
    """Read every path (files or folders), choosing the reader by extension and content."""
    from ingest import csv_export, github, jsonl, markdown

    for path in paths:
        path = Path(path)
        if path.is_dir():
            md_files = sorted(path.rglob("*.md"))
            data_files = sorted(p for p in path.rglob("*") if p.suffix.lower() in {".jsonl", ".json", ".csv"})
            if md_files:
                yield from markdown.read_markdown_dir(path)
            for file in data_files:
                yield from read_paths([file], csv_mapping)
            if not md_files and not data_files:
                yield IngestError(str(path), "folder", "no .md, .jsonl, .json or .csv files found")
            continue
        if not path.exists():
            yield IngestError(str(path), "file", "no such file or directory")
            continue
        suffix = path.suffix.lower()
        if suffix == ".csv":
            yield from csv_export.read_csv(path, csv_mapping)
        elif suffix == ".md":
            yield from markdown.read_markdown_files([path])
        elif suffix == ".json":
            if github.looks_like_github_export(path):
                yield from github.read_github_export(path)
            else:
                yield from jsonl.read_json_array(path)
        elif suffix in {".jsonl", ".ndjson"}:
            yield from jsonl.read_jsonl(path)
        else:
            yield IngestError(str(path), "file", f"unsupported file type {suffix or '(none)'}; "
                              "expected .jsonl, .json, .csv, .md or a folder")
