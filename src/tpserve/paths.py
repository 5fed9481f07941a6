"""Where tpserve keeps what it makes once and reuses: $TPSERVE_CACHE_DIR, else $XDG_CACHE_HOME/tpserve, else
~/.cache/tpserve (the built-in tiny checkpoint, weight snapshots, tuned collective tables)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    root = os.environ.get("TPSERVE_CACHE_DIR")
    if root:
        return Path(root)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "tpserve"
