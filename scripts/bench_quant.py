"""Bf16 / int8 / int4 weights: weight memory, batch-1 decode and a reduced workload A.

Code: benchmarks/bench_quant.py; `python -m benchmarks.bench_quant` runs the same.
Run from the repository root with PYTHONPATH=. or with the project installed (scripts/setup).
"""

import sys

from benchmarks.bench_quant import main

sys.exit(main())
