"""Structured outputs: JSON-schema requests against free ones, batch 1 and concurrent.

Code: benchmarks/bench_structured.py; `python -m benchmarks.bench_structured` runs the same.
Run from the repository root with PYTHONPATH=. or with the project installed (scripts/setup).
"""

import sys

from benchmarks.bench_structured import main

sys.exit(main())
