"""``python -m accelerando.commands.config``: the same as ``accelerando config``."""

import sys

from accelerando.commands.config import main

# Only when run as a program: importing the module (mkdocstrings, pydoc, a test walking the package)
# must not parse the importer's own command line ("accelerando config: error: invalid choice: 'build'").
if __name__ == "__main__":
    sys.exit(main())
