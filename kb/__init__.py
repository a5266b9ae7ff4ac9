"""pmkb's library: the suggestion engine and what runs on it, in layers (docs/architecture.md).

``kb.core`` (types, label space, settings, untrusted text) <- ``kb.engine`` (store, retrieval,
classification, the engine) <- ``kb.llm`` (models, prompts, the LLM-assisted suggester) and
``kb.tickets`` (ticket systems, the event queue, write-back) <- ``kb.jobs`` (annotate, backfill,
evaluate, feedback, reports). A layer imports only the layers below it; import-linter checks it
(``[tool.importlinter]`` in pyproject.toml).
"""

__version__ = "0.1.0"
