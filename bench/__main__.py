"""``python -m bench``: the end-to-end benchmark suite (bench/run.py);
``python -m bench serving [...]``: concurrent streams, ours against llama-server (bench/serving.py);
``python -m bench audit [...]``: the exactness audit of every engine (bench/audit.py)."""

import importlib
import sys

if sys.argv[1:2] in (["audit"], ["serving"]):
    study = importlib.import_module(f"bench.{sys.argv[1]}")
    sys.exit(study.main(sys.argv[2:]))

from .run import main

sys.exit(main())
