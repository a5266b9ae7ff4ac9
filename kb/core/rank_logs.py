"""The logs of a failed distributed job as sources: one file per rank, a directory, a Slurm output
with every rank interleaved, a tarball, or PyTorch flight-recorder dumps.

A source keeps its name (for citing lines) and, when its name says so, the rank that wrote it
(``rank3.log``, torchrun's ``attempt_0/3/stderr.log``, ``nccl_trace_rank_3``). A Slurm output's
``slurm-12345.out`` is a job id, never a rank. Flight-recorder dumps are pickles: they are read
with an unpickler that builds only plain data (dicts, lists, strings, numbers), because a dump
attached to a ticket is untrusted and a plain ``pickle.load`` would run whatever it names.
"""

from __future__ import annotations

import io
import json
import pickle
import re
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

MAX_TOTAL_BYTES = 256 * 1024 * 1024  # all sources together; more is cut with a note
MAX_LINE_CHARS = 4096  # a longer line is cut: the patterns read line starts and short messages

_RANK_IN_NAME = (re.compile(r"(?:^|[^a-z])rank[_\-.]?(\d{1,6})(?:\D|$)", re.I),  # rank3.log, out_rank_12.txt
                 re.compile(r"attempt_\d{1,4}/(\d{1,6})/(?:stdout|stderr|error)"))  # torchrun --log-dir
_DUMP_NAME = re.compile(r"(\d{1,6})(?:\.json|\.pkl|\.pickle)?$")  # torch's nccl_trace_rank_<N>


class RankLogError(ValueError):
    """A path that cannot be read as a job's logs; the message names it and says what to do."""


@dataclass
class LogSource:
    """One file of a job's logs: its lines, or a flight-recorder dump."""

    name: str
    rank: int | None = None  # the rank the file's name gives, if any
    lines: list[str] = field(default_factory=list)
    dump: dict | None = None  # a flight-recorder dump (plain data)
    notes: list[str] = field(default_factory=list)  # what was cut or skipped, for the report


class _PlainUnpickler(pickle.Unpickler):
    """Builds dicts, lists, tuples, strings and numbers only; any class reference is refused."""

    def find_class(self, module, name):
        raise RankLogError(f"the dump names {module}.{name}: a flight-recorder dump holds plain data only, "
                           "so this file is not one (it was not loaded)")


def rank_from_name(name: str) -> int | None:
    """The rank a log file's path gives, or None (a Slurm job id or a date is not a rank)."""
    for pattern in _RANK_IN_NAME:
        match = pattern.search(name.replace("\\", "/"))
        if match:
            return int(match.group(1))
    return None


def _is_dump_name(name: str) -> bool:
    base = name.rsplit("/", 1)[-1]
    return "trace" in base.lower() and bool(_DUMP_NAME.search(base))


def split_lines(text: str) -> list[str]:
    """A log text as lines, each cut at ``MAX_LINE_CHARS``."""
    return [line[:MAX_LINE_CHARS] for line in text.replace("\r\n", "\n").replace("\r", "\n").split("\n")]


def _decode(data: bytes) -> list[str]:
    return split_lines(data.decode("utf-8", errors="replace"))


def parse_source(name: str, data: bytes) -> LogSource:
    """One file's bytes as a source: a flight-recorder dump (pickle or JSON) or log lines."""
    base = name.rsplit("/", 1)[-1]
    if data[:1] == b"\x80" and _is_dump_name(name):
        try:
            return _dump_source(name, _PlainUnpickler(io.BytesIO(data)).load())
        except Exception as exc:  # noqa: BLE001 - a truncated, foreign or hostile pickle loses only itself
            return LogSource(name, notes=[f"{name}: not read as a flight-recorder dump "
                                          f"({exc.__class__.__name__}: {exc})"])
    if data.lstrip()[:1] == b"{" and _is_dump_name(name):
        try:
            return _dump_source(name, json.loads(data))
        except (ValueError, RankLogError) as exc:
            return LogSource(name, notes=[f"{name}: not read as a flight-recorder dump ({exc})"])
    if not data and _is_dump_name(name):
        return LogSource(name, notes=[f"{name}: an empty flight-recorder dump (the rank was stopped while "
                                      "writing it)"])
    if b"\x00" in data[:4096]:
        return LogSource(name, rank_from_name(name), notes=[f"{base}: binary, skipped"])
    return LogSource(name, rank_from_name(name), lines=_decode(data))


def _dump_source(name: str, dump) -> LogSource:
    if not isinstance(dump, dict) or not isinstance(dump.get("entries"), list):
        raise RankLogError(f"{name}: a flight-recorder dump is a mapping with 'entries'; this one is not")
    match = _DUMP_NAME.search(name.rsplit("/", 1)[-1])
    return LogSource(name, int(match.group(1)) if match else rank_from_name(name), dump=dump)


def read_sources(paths: list[str | Path]) -> list[LogSource]:
    """Every source under ``paths`` (files, directories, tarballs), in a stable order; raises
    RankLogError naming a path that does not exist or cannot be read."""
    budget = [MAX_TOTAL_BYTES]
    sources: list[LogSource] = []
    for raw in paths:
        path = Path(raw)
        if not path.exists():
            raise RankLogError(f"{path}: no such file or directory (give the job's log files, their "
                               "directory or a tarball)")
        if path.is_dir():
            files = sorted(p for p in path.rglob("*") if p.is_file())
            if not files:
                raise RankLogError(f"{path}: the directory holds no files")
            for file in files:
                sources.extend(_read_file(file, str(file.relative_to(path.parent)), budget))
        else:
            sources.extend(_read_file(path, path.name, budget))
    return sources


def read_upload(name: str, data: bytes, limit: int = MAX_TOTAL_BYTES) -> list[LogSource]:
    """The sources in one uploaded file (a log, a dump or a tarball of them, unpacked within
    ``limit`` bytes); raises RankLogError naming a damaged tarball."""
    if tarfile.is_tarfile(io.BytesIO(data)):
        return _read_tar(io.BytesIO(data), name, [limit])
    return [parse_source(name, data)]


def _read_file(path: Path, name: str, budget: list[int]) -> list[LogSource]:
    try:
        if tarfile.is_tarfile(path):
            return _read_tar(path, name, budget)
        data = _take(path.read_bytes(), budget)
    except OSError as exc:
        raise RankLogError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    if data is None:
        return [LogSource(name, notes=[f"{name}: skipped, past {MAX_TOTAL_BYTES // 2**20} MiB of logs"])]
    return [parse_source(name, data)]


def _read_tar(path: Path | io.BytesIO, name: str, budget: list[int]) -> list[LogSource]:
    """The regular files of a tarball, read in memory (nothing is extracted to disk)."""
    out: list[LogSource] = []
    try:
        with tarfile.open(path) if isinstance(path, Path) else tarfile.open(fileobj=path) as tar:
            for member in tar:
                if not member.isfile():
                    continue  # links, devices and directories are not logs
                if member.size > budget[0]:
                    out.append(LogSource(f"{name}:{member.name}", notes=[f"{member.name}: skipped, past the "
                                                                         "size limit of the unpacked logs"]))
                    continue
                handle = tar.extractfile(member)
                data = _take(handle.read() if handle else b"", budget)
                if data is not None:
                    out.append(parse_source(f"{name}:{member.name}", data))
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise RankLogError(f"{name}: a damaged tarball ({exc})") from None
    return sorted(out, key=lambda s: s.name)


def _take(data: bytes, budget: list[int]) -> bytes | None:
    if len(data) > budget[0]:
        return None
    budget[0] -= len(data)
    return data


def sources_as_text(sources: list[LogSource], limit: int = 2_000_000) -> str:
    """The sources' lines as one log text, each line of a per-rank file marked ``[rankN]:`` as PyTorch
    marks them, so the rank survives the merge (dumps have no text and are left out)."""
    out: list[str] = []
    size = 0
    for source in sources:
        for line in source.lines:
            if source.rank is not None and not line.startswith("[rank"):
                line = f"[rank{source.rank}]: {line}"
            size += len(line) + 1
            if size > limit:
                return "\n".join(out)
            out.append(line)
    return "\n".join(out)
