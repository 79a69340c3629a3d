"""``python -m accelerando.commands.launch``: the same as ``accelerando launch``."""

import sys

from accelerando.commands.launch.entry import main

if __name__ == "__main__":
    sys.exit(main())
