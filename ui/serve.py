"""The chat page with its knowledge base, model and engine loaded as the server starts.

    python -m ui.serve [streamlit options, e.g. --server.port 8501]

``streamlit run app.py`` loads them when the first visitor opens the page, who then waits for them
(seconds; minutes when the knowledge base is built first). This starts the same server in the same
way, but begins loading in a background thread first (``ui.resources.preload``), so the first
visitor finds them ready or nearly so; the page shows what it is waiting for meanwhile.
"""

from __future__ import annotations

import sys
from pathlib import Path

APP = Path(__file__).resolve().parent.parent / "app.py"


def main(argv: list[str]) -> None:
    """Start loading, then run Streamlit's own command line on app.py with the given options."""
    from streamlit.web import cli

    from kb.core.settings import load_settings
    from ui.resources import preload

    try:
        preload(load_settings())
    except ValueError:
        pass  # settings that do not validate: the page says what to fix
    sys.argv = ["streamlit", "run", str(APP), *argv]
    cli.main()


if __name__ == "__main__":
    main(sys.argv[1:])
