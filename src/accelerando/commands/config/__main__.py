"""``python -m accelerando.commands.config``: the same as ``accelerando config``."""

import sys

from accelerando.commands.config import main

sys.exit(main())
