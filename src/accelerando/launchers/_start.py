"""Start :mod:`accelerando.launchers._child` by path, without importing the accelerando package.

``python -u .../accelerando/launchers/_start.py RUN_DIR LAUNCHER_PID KIND TARGET [ARGS...]`` is what
the elastic agent runs in each process: Python puts this folder first on ``sys.path``, so the shim
loads as the top-level module ``_child`` from its cached byte code, and neither ``accelerando`` nor
``typing`` is imported before the target's first line (``python -m accelerando.launchers._child``
would import both; counted by tests/launchers/test_launch_startup_work.py). The shim then puts the
target's own folder (or the working folder) in place of this one.
"""

import _child  # pyright: ignore[reportMissingImports]  # this folder, as a top-level module

_child.main()
