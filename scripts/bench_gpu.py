"""Workloads A-D (and the model families' rows) against the floor measured in the same run.

Code: benchmarks/bench_gpu.py; `python -m benchmarks.bench_gpu` runs the same.
Run from the repository root with PYTHONPATH=. or with the project installed (scripts/setup).
"""

import sys

from benchmarks.bench_gpu import main

sys.exit(main())
