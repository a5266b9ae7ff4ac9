"""``pmkb chat``: suggest for a ticket, then answer follow-up questions about it in the terminal."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

LLM_HELP = "LLM backend: none, llamacpp or openai (default: $PMKB_LLM or none)."


def chat(
    text: Optional[str] = typer.Argument(None, help="Ticket text (or use --file)."),
    file: Optional[Path] = typer.Option(None, "--file", "-f", help="Read the ticket text from a file."),
    title: str = typer.Option("", "--title", help="Ticket title."),
    question: list[str] = typer.Option([], "--question", "-q", help="Ask this and exit (repeatable); "
                                       "without it, questions are read from the terminal."),
    llm: Optional[str] = typer.Option(None, "--llm", help=LLM_HELP),
    model: Optional[str] = typer.Option(None, "--model", help="GGUF path (llamacpp) or served model name "
                                        "(openai); default $PMKB_LLM_MODEL."),
    base_url: Optional[str] = typer.Option(None, "--base-url", help="OpenAI-compatible server URL, e.g. "
                                           "http://127.0.0.1:8000/v1 (default $PMKB_LLM_BASE_URL)."),
) -> None:
    """Suggest for one ticket, then answer follow-up questions about it (streamed when a model is set)."""
    from kb.core.suggestion import EmptyTicket, Ticket
    from kb.llm.chat import answer_followup
    from kb.llm.suggester import make_suggester
    from pmkb.cli import (
        check_llm,
        echo_err,
        fail,
        open_engine,
        read_ticket_text,
        render_card,
    )

    text = read_ticket_text(text, file, title)
    engine = open_engine(llm=check_llm(llm), llm_model=model, llm_base_url=base_url)
    try:
        suggestion = make_suggester(engine).suggest(Ticket(title=title, description=text))
    except EmptyTicket as exc:
        fail(str(exc))
    typer.echo(render_card(suggestion))
    typer.echo(f"explanation: {suggestion.explanation}")
    if suggestion.trace.get("llm_failed"):
        echo_err(f"warning: the model's answer was not used: {suggestion.trace.get('llm_error')}")
    interactive = not question
    if interactive:
        typer.echo("\nAsk a follow-up question (empty line or Ctrl-D to quit).")
    history: list[dict] = []
    questions = iter(question)
    while True:
        if interactive:
            try:
                asked = input("> ").strip()
            except (EOFError, KeyboardInterrupt):
                typer.echo("")
                break
        else:
            asked = next(questions, "")
        if not asked or asked.lower() in {"exit", "quit"}:
            break
        answer = []
        for piece in answer_followup(engine, suggestion, asked, history):
            answer.append(piece)
            sys.stdout.write(piece)
            sys.stdout.flush()
        typer.echo("")
        history += [{"role": "user", "content": asked}, {"role": "assistant", "content": "".join(answer)}]


def register(app: typer.Typer) -> None:
    """Add the ``chat`` command to the CLI."""
    app.command(name="chat")(chat)
