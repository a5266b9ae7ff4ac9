"""kb/ is the core: it never imports the shells' libraries."""

import ast
from pathlib import Path

FORBIDDEN = {"streamlit", "fastapi", "typer", "click", "uvicorn", "starlette", "mcp", "pmkb"}
KB = Path(__file__).resolve().parent.parent / "kb"


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_kb_never_imports_shell_libraries():
    offenders = {p.name: _imports(p) & FORBIDDEN for p in KB.glob("*.py") if p.name != "__main__.py"}
    assert {k: v for k, v in offenders.items() if v} == {}


def test_modules_stay_small():
    sizes = {p.name: len(p.read_text().splitlines()) for p in KB.glob("*.py")}
    assert max(sizes.values()) <= 500, sizes
