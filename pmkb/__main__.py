"""``python -m pmkb``: the same command line as ``pmkb``."""

from pmkb.cli import main

main()
