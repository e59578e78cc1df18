"""Locating the real Qwen2.5-Coder-0.5B pair for tests.

The pair is assembled from PyPI packages (the ``models`` extra).  Outside CI
a missing package skips the real-model tests with the reason; in CI
(``CI=true``) it is a failure, so a green CI always ran them.
"""

from __future__ import annotations

import os

import pytest


def default_pair() -> tuple[str, str]:
    from specdec_cpu import demo_models as models
    from specdec_cpu.errors import ModelLoadError

    try:
        target, draft = models.ensure_default_pair(progress=False)
    except ModelLoadError as exc:
        if os.environ.get("CI"):
            raise
        pytest.skip(f"real models unavailable: {exc}")
    return str(target), str(draft)
