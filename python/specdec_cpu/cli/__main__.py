"""``python -m specdec_cpu.cli``: the same as the ``specdec-cpu`` command."""

import sys

from . import main

sys.exit(main())
