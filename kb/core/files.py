"""Files that pmkb keeps for itself: written whole, readable by their owner only."""

from __future__ import annotations

import os
import re
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


def per_model_file(path: Path, model_id: str, suffix: str) -> Path:
    """The file of one embedding model's data: ``path`` itself when it is a file, else the file in
    the folder ``path`` named after the model (``sentence-transformers:package:x`` ->
    ``sentence-transformers_package_x<suffix>``). The bundled data keeps a file per model, so that
    a knowledge base on the default model and one on the light model both build and answer from
    what ships."""
    if path.suffix == suffix and not path.is_dir():
        return path
    return path / (re.sub(r"[^A-Za-z0-9._-]", "_", model_id) + suffix)
