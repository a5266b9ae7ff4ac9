"""What a source of incidents yields, record by record, and how its bytes become text.

Readers (``ingest/``) turn files into ``Parsed`` items: an Incident, an ``IngestError`` naming
the file and line (or record) and what is wrong, or an ``IngestWarning`` that loses nothing.
Jobs such as the backfill take those items without knowing which reader made them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kb.core.incidents import Incident
from kb.core.redact import redact


@dataclass
class IngestError:
    """A record that could not be read; ingest reports it and goes on.

    The message often quotes the bad record (a snippet, its id, a parser's context line), so it is
    redacted like the record itself would have been.
    """

    file: str
    where: str  # "line 12", "record 3", "row 7"
    message: str

    def __post_init__(self) -> None:
        self.message = redact(self.message)

    def __str__(self) -> str:
        return f"{self.file}: {self.where}: {self.message}"


@dataclass
class IngestWarning:
    """Something the user should know that does not lose the record (e.g. a Latin-1 file)."""

    file: str
    message: str

    def __str__(self) -> str:
        return f"{self.file}: {self.message}"


Parsed = Incident | IngestError | IngestWarning


def decode_bytes(raw: bytes) -> tuple[str, str | None]:
    """Decode a file's bytes: UTF-8 (BOM allowed), else Windows-1252/Latin-1 with a warning."""
    try:
        return raw.decode("utf-8-sig"), None
    except UnicodeDecodeError as exc:
        where = f"byte {exc.start}"
    for encoding in ("cp1252", "latin-1"):
        try:
            text = raw.decode(encoding)
        except UnicodeDecodeError:
            continue
        return text, (f"not valid UTF-8 (first bad {where}); read as {encoding}. "
                      "Re-save the file as UTF-8 to silence this warning.")
    raise AssertionError("latin-1 decodes every byte string")


def read_text(path: Path) -> tuple[str, str | None]:
    """Read a file as text, tolerating non-UTF-8 encodings (see decode_bytes)."""
    return decode_bytes(Path(path).read_bytes())
