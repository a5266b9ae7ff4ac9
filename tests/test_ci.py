"""CI runs the README's test command, and the make test targets lint with ruff before pytest."""

from __future__ import annotations

import re

from conftest import ROOT


def _recipe(target: str) -> list[str]:
    """The command lines of a Makefile target."""
    text = (ROOT / "Makefile").read_text()
    match = re.search(rf"^{re.escape(target)}:.*\n((?:\t.*\n)+)", text, re.MULTILINE)
    assert match, f"Makefile has no target {target}"
    return [line.strip() for line in match.group(1).splitlines()]


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    assert re.search(r"^make test\b", readme, re.MULTILINE), "the README's quick start names `make test`"
    commands = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()
                if line.strip() and not line.lstrip().startswith("#")]
    assert commands[-1] == "make test"


def test_make_test_targets_run_ruff_before_pytest():
    for target in ("test", "test-fast"):
        recipe = _recipe(target)
        ruff = next(n for n, line in enumerate(recipe) if "ruff check ." in line)
        pytest_ = next(n for n, line in enumerate(recipe) if "-m pytest" in line)
        assert ruff < pytest_, f"make {target} runs ruff after pytest"
