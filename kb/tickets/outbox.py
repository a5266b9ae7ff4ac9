"""The dry run's ticket system: each write-back call is appended to an outbox JSONL file instead.

It answers like a ticket with no comments and no labels, so a dry run plans exactly what a first
write-back would do: add the suggested labels and post the comment.
"""

from __future__ import annotations

import json
import os
from datetime import datetime, timezone
from pathlib import Path

from kb.tickets.api import Identity, TicketRef


class OutboxTicketSystem:
    """A ``TicketSystem`` that records the calls of one write-back in a JSONL file."""

    def __init__(self, outbox: Path, ref: TicketRef):
        self.outbox, self.ref = Path(outbox), ref
        self.at = datetime.now(timezone.utc).isoformat(timespec="milliseconds")  # one time for one write-back
        if ref.system == "github":
            owner, repo, number = ref.github_parts()
            self.issue = f"/repos/{owner}/{repo}/issues/{number}"
        else:
            self.issue = f"/rest/api/2/issue/{ref.key}"

    def identity(self) -> Identity:
        """An account that wrote nothing: no comment on the ticket is taken for pmkb's."""
        return Identity()

    def comments(self) -> list[dict]:
        """None: the dry run plans as for a ticket pmkb never wrote to."""
        return []

    def labels(self) -> list[str]:
        """None: every suggested label is planned."""
        return []

    def change_labels(self, add: list[str], remove: list[str]) -> None:
        """Record the labels to add (with no comment of pmkb's there is never one to remove)."""
        if not add:
            return
        if self.ref.system == "github":
            self._record("add_labels", "POST", f"{self.issue}/labels", {"labels": add})
        else:
            self._record("add_labels", "PUT", self.issue, {"update": {"labels": [{"add": x} for x in add]}})

    def create_comment(self, body: str) -> None:
        """Record the comment to post; it has no id yet."""
        path = f"{self.issue}/comments" if self.ref.system == "github" else f"{self.issue}/comment"
        self._record("upsert_comment", "POST", path, {"body": body})

    def update_comment(self, comment_id: str | int, body: str) -> None:
        """Record the comment as planned (the outbox never lists a comment to update)."""
        self.create_comment(body)

    def outcome(self) -> dict:
        """A dry run: where the calls went, the comment only planned."""
        return {"dry_run": True, "outbox": str(self.outbox), "comment": "planned", "comment_id": None}

    def _record(self, action: str, method: str, path: str, body: dict) -> None:
        self.outbox.parent.mkdir(parents=True, exist_ok=True)
        line = (json.dumps({"at": self.at, "system": self.ref.system, "ticket": self.ref.key, "action": action,
                            "method": method, "path": path, "json": body}, ensure_ascii=False) + "\n").encode()
        append_whole_line(self.outbox, line)


def append_whole_line(path: Path, line: bytes) -> None:
    """Append one line whole or not at all: a write cut short (a full disk) is undone, so the file
    never holds a torn line; the error is raised. Created owner-only (it holds ticket text)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        start = os.fstat(fd).st_size
        try:
            written = 0
            while written < len(line):
                written += os.write(fd, line[written:])
            os.fsync(fd)
        except OSError:
            try:
                os.ftruncate(fd, start)
            except OSError:
                pass
            raise
    finally:
        os.close(fd)
