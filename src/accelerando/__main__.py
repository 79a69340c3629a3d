"""``python -m accelerando ...`` runs the ``accelerando`` command line."""

from accelerando.commands.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
