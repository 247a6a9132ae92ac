"""N-gram speculative decoding end to end on the embedded model, against plain decoding.

Code: benchmarks/bench_spec_engine.py; `python -m benchmarks.bench_spec_engine` runs the same.
Run from the repository root with PYTHONPATH=. or with the project installed (scripts/setup).
"""

import sys

from benchmarks.bench_spec_engine import main

sys.exit(main())
