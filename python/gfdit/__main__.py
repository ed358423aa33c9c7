"""``python -m gfdit``: the ``gfdit`` command (gfdit.tools.cli)."""

import sys

from gfdit.tools.cli import main

sys.exit(main())
