"""``python -m bench``: the end-to-end benchmark suite (bench/run.py)."""

import sys

from .run import main

sys.exit(main())
