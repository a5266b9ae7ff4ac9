"""pmkb is a package: its pins stay those of requirements*.txt, each install covers what its code
imports, its data travels inside it, and (slow) its wheel runs in a clean virtualenv."""

from __future__ import annotations

import ast
import importlib.util
import re
import shutil
import subprocess
import sys
import time
import tomllib
from importlib.metadata import PackageNotFoundError, packages_distributions, requires
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from kb.core.files import per_model_file
from kb.core.settings import DATA_DIR, DEFAULT_EMBEDDING_MODEL, PROMPTS_DIR, Settings
from pmkb.extras import EXTRA_FOR_MODULE
from tests.conftest import ROOT, command_env

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
FIRST_PARTY = {"kb", "ingest", "pmkb", "ui", "pmkb_data", "pmkb_prompts", "__future__"}

CORE_CODE = ["kb/*.py", "ingest/*.py", "pmkb/cli.py", "pmkb/options.py", "pmkb/extras.py", "pmkb/*_cmd.py"]
"""What `pmkb build` and `pmkb suggest` load: kb/, ingest/ and the command line with every
command module it registers at start-up."""
EXTRA_CODE = {"serve": ["pmkb/server.py", "pmkb/ops.py", "pmkb/payloads.py", "pmkb/api_models.py",
                        "pmkb/listener.py"],
              "app": ["app.py", "ui/*.py"], "mcp": ["pmkb/mcp_server.py", "pmkb/ops.py", "pmkb/listener.py"]}
"""The shells that need an extra: their module-level imports are covered by core + that extra."""
ALL_CODE = ["kb/*.py", "ingest/*.py", "pmkb/*.py", "ui/*.py", "app.py"]


def pins_by_group() -> dict[str, list[str]]:
    """Pinned requirements of pyproject.toml: "core" (dependencies) and each extra."""
    project = PYPROJECT["project"]
    groups = {"core": project["dependencies"], **project["optional-dependencies"]}
    return {name: [pin for pin in pins if not pin.startswith("pmkb[")] for name, pins in groups.items()}


def requirement_lines(path: Path) -> list[str]:
    """The requirement lines of a requirements file, comments and pip options left out."""
    lines = (line.split("#", 1)[0].strip() for line in path.read_text(encoding="utf-8").splitlines())
    return [line for line in lines if line and not line.startswith("-")]


def test_pins_in_pyproject_and_requirements_files_are_the_same():
    declared = [pin for pins in pins_by_group().values() for pin in pins]
    locked = [line for path in sorted(ROOT.glob("requirements*.txt")) for line in requirement_lines(path)]
    assert sorted(set(declared) - set(locked)) == [], "in pyproject.toml, not in requirements*.txt"
    assert sorted(set(locked) - set(declared)) == [], "in requirements*.txt, not in pyproject.toml"
    assert len(declared) == len(set(declared)) and len(locked) == len(set(locked)), "a pin is listed twice"
    assert all("==" in pin for pin in declared), "every requirement is pinned"


def test_requirements_txt_holds_the_core_install():
    """`make run` installs requirements.txt, then pmkb itself without dependencies."""
    assert set(pins_by_group()["core"]) <= set(requirement_lines(ROOT / "requirements.txt"))


def _closure(pins: list[str]) -> set[str]:
    """Distributions a pip install of ``pins`` brings, read from the installed metadata."""
    seen: set[str] = set()
    todo = [Requirement(pin) for pin in pins]
    while todo:
        req = todo.pop()
        key = (canonicalize_name(req.name), frozenset(req.extras))
        if key in seen:
            continue
        seen.add(key)
        try:
            needs = requires(req.name) or []
        except PackageNotFoundError:
            continue
        extras = [""] + sorted(req.extras)
        todo += [dep for dep in map(Requirement, needs)
                 if dep.marker is None or any(dep.marker.evaluate({"extra": e}) for e in extras)]
    return {name for name, _ in seen}


def provided_modules(groups: list[str]) -> set[str]:
    """Top-level modules that an install of these groups (core, serve, ...) provides."""
    pins = [pin for group in groups for pin in pins_by_group()[group]]
    dists = _closure(pins)
    return {module for module, owners in packages_distributions().items()
            if any(canonicalize_name(owner) in dists for owner in owners)}


def third_party_imports(patterns: list[str], module_level: bool) -> dict[str, set[str]]:
    """Third-party top-level modules each file imports (at module level only, or anywhere)."""
    found = {}
    for path in sorted({p for pattern in patterns for p in ROOT.glob(pattern)}):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        nodes = tree.body if module_level else ast.walk(tree)
        names = set()
        for node in nodes:
            if isinstance(node, ast.Import):
                names.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names.add(node.module.split(".")[0])
        found[str(path.relative_to(ROOT))] = names - FIRST_PARTY - set(sys.stdlib_module_names)
    return found


def _uncovered(patterns: list[str], groups: list[str], module_level: bool) -> dict[str, set[str]]:
    have = provided_modules(groups)
    missing = {path: names - have for path, names in third_party_imports(patterns, module_level).items()}
    return {path: names for path, names in missing.items() if names}


def test_the_core_install_covers_what_the_command_line_loads():
    assert _uncovered(CORE_CODE, ["core"], module_level=True) == {}


@pytest.mark.parametrize("extra", sorted(EXTRA_CODE))
def test_each_extra_covers_its_shell(extra):
    assert _uncovered(EXTRA_CODE[extra], ["core", extra], module_level=True) == {}


def installed(module: str) -> bool:
    """Whether ``module`` can be imported here; which distribution gives a module is known only then."""
    return importlib.util.find_spec(module) is not None


def test_every_library_the_code_imports_comes_with_some_install():
    # A library of an extra this environment lacks (`make test-fast` leaves out llama-cpp-python)
    # cannot be traced to its distribution; `make test` installs every extra and checks it.
    missing = {path: {name for name in names if installed(name)}
               for path, names in _uncovered(ALL_CODE, list(pins_by_group()), module_level=False).items()}
    assert {path: names for path, names in missing.items() if names} == {}, \
        "pin these in requirements*.txt and in pyproject.toml (dependencies or an extra)"


def test_the_missing_extra_hints_name_real_extras():
    core = provided_modules(["core"])
    for module, extra in EXTRA_FOR_MODULE.items():
        assert extra in pins_by_group(), extra
        if installed(module):
            assert module in provided_modules(["core", extra]) - core, module


def test_bundled_files_are_found_through_importlib_resources():
    defaults = Settings()
    for path in (defaults.taxonomy, defaults.low_gpu_taxonomy, defaults.signatures):
        assert path.is_file() and path.parent == DATA_DIR
    model_id = f"sentence-transformers:{DEFAULT_EMBEDDING_MODEL}"
    for folder, suffix in ((defaults.default_calibration, ".json"), (defaults.bundled_vectors, ".npz")):
        assert folder.parent == DATA_DIR and per_model_file(folder, model_id, suffix).is_file()
    assert sorted(defaults.bundled_incidents.glob("*.jsonl"))
    assert {p.name for p in PROMPTS_DIR.glob("*.j2")} >= {"suggest.system.j2", "suggest.user.j2"}


def test_every_bundled_file_is_package_data():
    """A new kind of file under data/ or prompts/ must be listed, or the wheel would leave it out."""
    setuptools = PYPROJECT["tool"]["setuptools"]
    listed = set()
    for package, patterns in setuptools["package-data"].items():
        top, *sub = package.split(".")
        folder = ROOT / setuptools["package-dir"][top] / Path(*sub)
        listed |= {p for pattern in patterns for p in folder.glob(pattern)}
    tracked = subprocess.run(["git", "ls-files", "data", "prompts"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.split()
    files = {ROOT / name for name in tracked if not name.endswith("__init__.py")}
    assert files and sorted(map(str, files - listed)) == []


# --- the wheel in a clean virtualenv ---------------------------------------------------------------------------

IGNORED = shutil.ignore_patterns(".venv", ".git", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache",
                                 "tests", "bench", "docs")


def _run(args, timeout, **kw) -> tuple[subprocess.CompletedProcess, float]:
    start = time.perf_counter()
    proc = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=timeout, **kw)
    elapsed = time.perf_counter() - start
    assert proc.returncode == 0, f"{args} exited {proc.returncode}:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    return proc, elapsed


@pytest.mark.slow
def test_the_wheel_installs_and_runs_in_a_clean_virtualenv(tmp_path, _built_kb_dir):
    # Build from a copy, so the build leaves nothing in the checkout.
    source = tmp_path / "source"
    shutil.copytree(ROOT, source, ignore=IGNORED)
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", tmp_path / "dist",
          source], timeout=300)
    [wheel] = (tmp_path / "dist").glob("pmkb-*.whl")

    env = {k: v for k, v in command_env().items() if k not in {"PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME"}}
    env["HOME"] = str(tmp_path / "home")
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", venv], timeout=120, env=env)
    python, pmkb = venv / "bin" / "python", venv / "bin" / "pmkb"
    # --no-compile: byte-compiling every dependency's sources (torch's thousands) takes half the
    # install; the modules pmkb imports are compiled on first import all the same.
    _, install_s = _run([python, "-m", "pip", "install", "-q", "--no-compile", wheel], timeout=900, env=env)

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    run = lambda *args, timeout=600: _run([pmkb, *args], timeout=timeout, env=env, cwd=elsewhere)  # noqa: E731

    where, _ = _run([python, "-c", "import kb, pmkb_data; print(kb.__file__); print(pmkb_data.__file__)"],
                    timeout=120, env=env, cwd=elsewhere)
    assert all(line.startswith(str(venv)) for line in where.stdout.split()), where.stdout
    # The bundled reports build a knowledge base from the installed package; the hashing embedder
    # keeps it quick (embedding them with the model takes minutes on two cores).
    built, build_s = run("build", "--kb", tmp_path / "hashing-kb", "--config", _hashing_config(tmp_path))
    assert int(re.search(r"ready: (\d+) incidents", built.stdout).group(1)) > 1000, built.stdout
    # The model from the wheel's dependencies, on a copy of the knowledge base the session built.
    env["PMKB_HOME"] = str(tmp_path / "kb")
    shutil.copytree(_built_kb_dir, tmp_path / "kb")
    suggestion, first_s = run("suggest", "Xid 79 GPU has fallen off the bus on gpu-a17", "--json")
    assert '"root_cause": "gpu_lost"' in suggestion.stdout
    _, again_s = run("suggest", "Xid 79 GPU has fallen off the bus on gpu-a17", "--json")
    assert "--port" in run("serve", "--help")[0].stdout
    # Without the serve extra, serving says what to install.
    refused = subprocess.run([pmkb, "serve"], capture_output=True, text=True, timeout=300, env=env, cwd=elsewhere)
    assert refused.returncode == 2 and "pmkb[serve]" in refused.stderr, refused.stderr[-2000:]
    print(f"\nwheel {wheel.name}: {wheel.stat().st_size / 1e3:.0f} kB; clean-venv install {install_s:.0f} s; "
          f"pmkb build (hashing) {build_s:.0f} s; first pmkb suggest {first_s:.1f} s, next {again_s:.1f} s")


def _hashing_config(folder: Path) -> Path:
    path = folder / "hashing.yaml"
    path.write_text("embedder: hashing\n")
    return path
