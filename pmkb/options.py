"""The options every command takes: ``--kb``, ``--config`` and ``--taxonomy``.

People type them before the command (``pmkb --kb DIR ingest F``) as often as after it
(``pmkb ingest F --kb DIR``). The group callback reads the first form; ``add_shared_options``
wraps every registered command once so that it takes the same three options, which no command
has to list itself. Given in both places, the one after the command wins.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from pathlib import Path

import typer

PANEL = "Knowledge base"
"""Help panel the shared options are listed under, in every command's --help."""


class State:
    """Values of the shared options for this invocation."""

    kb: Path | None = None
    config: Path | None = None
    taxonomy: Path | None = None


state = State()


def shared_options() -> dict[str, typer.models.OptionInfo]:
    """Fresh typer options for the shared settings, by the ``State`` attribute they set."""
    return {
        "kb": typer.Option(None, "--kb", rich_help_panel=PANEL,
                           help="Knowledge-base directory (default: $PMKB_HOME or ~/.local/share/pmkb)."),
        "config": typer.Option(None, "--config", rich_help_panel=PANEL,
                               help="YAML settings file (or $PMKB_CONFIG)."),
        "taxonomy": typer.Option(None, "--taxonomy", rich_help_panel=PANEL,
                                 help="Taxonomy YAML to use instead of the bundled one."),
    }


_PREFIX = "shared_"
"""Parameter names of the added options, kept apart from the command's own parameters."""
_WRAPPED: set[Callable] = set()
"""Commands that already take the shared options (adding them twice would repeat the options)."""


def accept_shared_options(command: Callable) -> Callable:
    """``command`` taking the shared options too; the values given are stored in ``state``."""
    if command in _WRAPPED:
        return command
    signature = inspect.signature(command, eval_str=True)

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        for name in shared_options():
            value = kwargs.pop(_PREFIX + name, None)
            if value is not None:
                setattr(state, name, value)
        return command(*args, **kwargs)

    added = [inspect.Parameter(_PREFIX + name, inspect.Parameter.KEYWORD_ONLY, default=option,
                               annotation=Path | None) for name, option in shared_options().items()]
    params = [*signature.parameters.values(), *added]
    # typer reads the signature and the type hints; both must list the added options.
    wrapper.__signature__ = signature.replace(parameters=params)
    wrapper.__annotations__ = {p.name: p.annotation for p in params if p.annotation is not p.empty}
    _WRAPPED.add(wrapper)
    return wrapper


def add_shared_options(app: typer.Typer) -> None:
    """Let every command of ``app``, and of its command groups, take the shared options."""
    for info in app.registered_commands:
        info.callback = accept_shared_options(info.callback)
    for group in app.registered_groups:
        add_shared_options(group.typer_instance)
