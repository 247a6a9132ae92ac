"""CPU throughput: the engine against transformers on the same prompts, in one run.

Code: benchmarks/bench_cpu.py; `python -m benchmarks.bench_cpu` runs the same.
Run from the repository root with PYTHONPATH=. or with the project installed (scripts/setup).
"""

import sys

from benchmarks.bench_cpu import main

sys.exit(main())
