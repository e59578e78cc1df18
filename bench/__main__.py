"""``python -m bench``: the end-to-end benchmark suite (bench/run.py);
``python -m bench serving [...]``: concurrent streams, ours against llama-server (bench/serving.py);
``python -m bench audit [...]``: the exactness audit of every engine (bench/audit.py)."""

import sys

if sys.argv[1:2] == ["audit"]:
    from .audit import main as audit_main

    sys.exit(audit_main(sys.argv[2:]))

if sys.argv[1:2] == ["serving"]:
    from .serving import main as serving_main

    sys.exit(serving_main(sys.argv[2:]))

from .run import main

sys.exit(main())
