"""The layering of kb/ and the shells, as import-linter contracts (``[tool.importlinter]`` in pyproject.toml)."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
KB = ROOT / "kb"


def _lint_imports(root: Path) -> subprocess.CompletedProcess:
    command = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or shutil.which("lint-imports")
    if command is None:
        pytest.fail("lint-imports is missing: install the test requirements (make test-fast does)")
    return subprocess.run([command, "--no-cache"], cwd=root, capture_output=True, text=True, timeout=120)


def test_the_import_contracts_are_kept():
    done = _lint_imports(ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout


@pytest.mark.parametrize("module, planted, broken", [
    ("kb/core/taxonomy.py", "from kb.engine import store", "kb is layered"),
    ("kb/tickets/queue.py", "from kb.llm import backends", "kb is layered"),
    ("kb/engine/search.py", "import ingest", "the shells sit on the library"),
    ("kb/jobs/report.py", "import streamlit", "kb never imports a shell's library"),
])
def test_a_planted_violation_breaks_its_contract(tmp_path, module, planted, broken):
    for name in ("kb", "ingest", "pmkb", "ui"):
        shutil.copytree(ROOT / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    target = tmp_path / module
    target.write_text(target.read_text() + f"\n{planted}  # planted\n")
    done = _lint_imports(tmp_path)
    assert done.returncode == 1
    assert f"{broken}" in done.stdout.split("Broken contracts")[1]


def test_modules_stay_small():
    sizes = {str(p.relative_to(ROOT)): len(p.read_text().splitlines()) for p in KB.rglob("*.py")}
    assert max(sizes.values()) <= 500, sizes


def test_two_package_levels_at_most():
    deep = [str(p.relative_to(ROOT)) for p in KB.rglob("*.py") if len(p.relative_to(KB).parts) > 2]
    assert deep == []


HEAVY = ("torch", "sentence_transformers", "transformers", "chromadb", "sklearn", "kubernetes", "uvicorn")
"""Libraries a command that reads no text and searches nothing must not import."""


@pytest.mark.parametrize("command", [["taxonomy"], ["--help"], ["remediate", "--help"]])
def test_light_commands_import_nothing_heavy(command, tmp_path):
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "pmkb", "--kb", str(tmp_path), *command],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    imported = {line.split("|")[-1].strip().split(".")[0] for line in done.stderr.splitlines()
                if line.startswith("import time:")}
    assert not imported & set(HEAVY), sorted(imported & set(HEAVY))
