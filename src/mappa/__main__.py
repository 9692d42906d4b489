"""``python -m mappa``: the command line, where the ``mappa`` script is not on PATH (a
virtual environment not activated)."""

from mappa.cli import main

raise SystemExit(main())
