"""Files that pmkb keeps for itself: written whole, readable by their owner only."""

from __future__ import annotations

import os
from pathlib import Path
from typing import BinaryIO, Callable


def write_private(path: Path, write: Callable[[BinaryIO], None]) -> None:
    """Write a file through ``write`` atomically, mode 0600: a crash mid-write leaves the old file or none."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    partial.unlink(missing_ok=True)
    try:
        with os.fdopen(os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as fh:
            write(fh)
        os.replace(partial, path)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
