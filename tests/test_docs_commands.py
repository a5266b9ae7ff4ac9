"""Every command line that the README and docs/ show parses against the real command line, and
every import in the shells and the library resolves, so a moved function or a renamed option can
never break a documented command unnoticed. The slow tier runs the documented one-shot commands."""

from __future__ import annotations

import ast
import importlib
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from typer.core import TyperGroup

from tests.conftest import ROOT

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
COMMAND = re.compile(r"^(?:[A-Z_]+=\S+\s+)*(?:\.venv/bin/)?pmkb(?:\s|$)")
SHELL = {"bash", "sh", "shell", "console"}
PACKAGES = ("kb", "pmkb", "ingest", "ui")


def documented_commands() -> list[tuple[str, str]]:
    """(where, command line) for each `pmkb ...` line of a shell code block (```bash, ```sh) of the docs."""
    found = []
    for doc in DOCS:
        fence = None
        for number, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1):
            if line.lstrip().startswith("```"):
                fence = line.strip()[3:] if fence is None else None
                continue
            if fence in SHELL and COMMAND.match(line.strip()):
                found.append((f"{doc.name}:{number}", line.strip()))
    return found


def command_words(line: str) -> list[str]:
    """The arguments after `pmkb`: comments, environment assignments and brackets of optional parts go."""
    line = re.sub(r"\s#\s.*$", "", line)
    words = shlex.split(line.replace("[", " ").replace("]", " "))
    while words and re.match(r"^[A-Z_]+=", words[0]):
        words.pop(0)
    assert words and words[0].endswith("pmkb"), line
    return words[1:]


def parse(words: list[str]):
    """Parse a command line as the real `pmkb` would, without running it; raises typer's errors."""
    from pmkb.cli import app

    group = typer.main.get_command(app)
    context = group.make_context("pmkb", list(words), resilient_parsing=False)
    rest = [*context._protected_args, *context.args]
    while rest and isinstance(command := context.command, TyperGroup):
        name, sub, rest = command.resolve_command(context, rest)
        context = sub.make_context(name, rest, parent=context)
        rest = [*context._protected_args, *context.args] if isinstance(sub, TyperGroup) else []
    return context


def test_the_docs_show_commands():
    shown = {command_words(line)[0] for _, line in documented_commands() if command_words(line)}
    assert {"ingest", "search", "suggest", "backfill", "serve"} <= shown


@pytest.mark.parametrize(("where", "line"), documented_commands(), ids=lambda v: v if ":" in v else None)
def test_documented_command_parses(where, line):
    try:
        parse(command_words(line))
    except typer.TyperException as exc:
        pytest.fail(f"{where}: `{line}` does not parse: {exc.format_message()}")


def test_parse_catches_an_unknown_option_and_command():
    with pytest.raises(typer.TyperException):
        parse(["suggest", "text", "--no-such-option"])
    with pytest.raises(typer.TyperException):
        parse(["no-such-command"])


def own_imports(path: Path) -> list[tuple[int, str, str | None]]:
    """(line, module, name) of every import of the project's own modules in a file, nested ones too."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                and node.module.split(".")[0] in PACKAGES:
            found += [(node.lineno, node.module, alias.name) for alias in node.names]
        elif isinstance(node, ast.Import):
            found += [(node.lineno, alias.name, None) for alias in node.names
                      if alias.name.split(".")[0] in PACKAGES]
    return found


def unresolved_imports(paths) -> list[str]:
    """Imports of the project's own modules that name a module or a name that does not exist."""
    broken = []
    for path in paths:
        for line, module, name in own_imports(path):
            where = f"{path.relative_to(ROOT)}:{line}"
            try:
                imported = importlib.import_module(module)
            except ModuleNotFoundError as exc:
                if exc.name and exc.name.split(".")[0] in PACKAGES:
                    broken.append(f"{where}: no module {module}")
                continue  # an optional extra that is not installed is the shell's message to give
            if name and name != "*" and not hasattr(imported, name):
                try:
                    importlib.import_module(f"{module}.{name}")
                except ModuleNotFoundError:
                    broken.append(f"{where}: cannot import name {name!r} from {module!r}")
    return broken


def test_every_import_of_our_own_modules_resolves_even_inside_functions():
    files = [p for package in PACKAGES for p in sorted((ROOT / package).rglob("*.py"))] + [ROOT / "app.py"]
    assert unresolved_imports(files) == []


def test_the_import_check_catches_a_moved_function(tmp_path):
    stale = tmp_path / "stale.py"
    stale.write_text("def read(path):\n    from kb.core.records import no_such_reader\n    return no_such_reader(path)\n")
    stale = stale.rename(ROOT / "tests" / f"_stale_{tmp_path.name}.py")
    try:
        assert [b.split(": ", 1)[1] for b in unresolved_imports([stale])] == [
            "cannot import name 'no_such_reader' from 'kb.core.records'"]
    finally:
        stale.unlink()


def run_pmkb(home: Path, words: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """`python -m pmkb --kb HOME WORDS...` in ``cwd`` (which must hold no folder named like a package)."""
    return subprocess.run([sys.executable, "-m", "pmkb", "--kb", str(home), *words], cwd=cwd,
                          capture_output=True, text=True, timeout=600)


SAMPLE_TICKET = "Job 4411 crashed on gpu-a17: Xid 79, GPU has fallen off the bus"
"""What a documented command's ticket file (`ticket.txt`) holds when the test runs it."""


RUNNABLE = {"search", "taxonomy", "stats", "suggest", "node"}
"""Documented commands that answer at once from a built knowledge base and need no input files."""


@pytest.mark.slow
def test_documented_one_shot_commands_run_as_written(tmp_path, _built_kb_dir):
    import shutil

    home, work = tmp_path / "home", tmp_path / "work"
    shutil.copytree(_built_kb_dir, home)
    work.mkdir()
    (work / "ticket.txt").write_text(SAMPLE_TICKET)
    ran = 0
    for where, line in documented_commands():
        words = command_words(line)
        if words and words[0] in RUNNABLE:
            proc = run_pmkb(home, words, work)
            assert proc.returncode == 0, f"{where}: `{line}` exited {proc.returncode}: {proc.stderr[-1500:]}"
            ran += 1
    assert ran >= 5


@pytest.mark.slow
def test_suggest_reads_the_ticket_from_a_file(tmp_path, _built_kb_dir):
    import shutil

    home = tmp_path / "home"
    shutil.copytree(_built_kb_dir, home)
    ticket = tmp_path / "ticket.txt"
    ticket.write_bytes("Job 4411 crashed: Xid 79, GPU has fallen off the bus on gpu-a17 \u2013 node caf\u00e9".encode("cp1252"))
    proc = run_pmkb(home, ["suggest", "--file", str(ticket), "--json"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-1500:]
    assert json.loads(proc.stdout)["root_cause"] == "gpu_lost"
    assert "not valid UTF-8" in proc.stderr and str(ticket) in proc.stderr
    missing = run_pmkb(home, ["suggest", "--file", str(tmp_path / "nope.txt")], tmp_path)
    assert missing.returncode == 2 and "cannot read" in missing.stderr and "nope.txt" in missing.stderr
