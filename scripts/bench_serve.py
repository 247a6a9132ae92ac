"""The served path against the offline engine, on the same prompts in one run.

Code: benchmarks/bench_serve.py; `python -m benchmarks.bench_serve` runs the same.
Run from the repository root with PYTHONPATH=. or with the project installed (scripts/setup).
"""

import sys

from benchmarks.bench_serve import main

sys.exit(main())
