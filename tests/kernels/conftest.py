"""tests/kernels' helper modules (interpreted.py, lanes.py) import as top-level modules from every subject folder."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
