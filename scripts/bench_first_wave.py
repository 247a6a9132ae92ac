"""What the first users of a fresh server wait for: start-up, then its first waves.

Code: benchmarks/bench_first_wave.py; `python -m benchmarks.bench_first_wave` runs the same.
Run from the repository root with PYTHONPATH=. or with the project installed (scripts/setup).
"""

import sys

from benchmarks.bench_first_wave import main

sys.exit(main())
