"""Which optional install (pyproject's extras) brings a library the core install leaves out.

``pip install pmkb`` gives the engine and the command line; ``pmkb serve`` needs ``pmkb[serve]``,
``pmkb mcp`` needs ``pmkb[mcp]``, the LLM backends ``pmkb[openai]`` or ``pmkb[llamacpp]``. A command
that reaches for a library of an extra that is not installed says which one to install instead of
printing a traceback.
"""

from __future__ import annotations

EXTRA_FOR_MODULE = {
    "fastapi": "serve",
    "starlette": "serve",
    "prometheus_client": "serve",
    "streamlit": "app",
    "pandas": "app",
    "langchain_openai": "openai",
    "openai": "openai",
    "llama_cpp": "llamacpp",
    "mcp": "mcp",
}
"""Top-level module -> the extra of pyproject.toml that installs it."""


def missing_extra_hint(exc: ModuleNotFoundError) -> str | None:
    """What to install for a library of an extra that is missing; None for any other missing module."""
    module = (exc.name or "").split(".")[0]
    extra = EXTRA_FOR_MODULE.get(module)
    if extra is None:
        return None
    return f"{module} is not installed: it comes with pmkb's '{extra}' extra (pip install 'pmkb[{extra}]')"
