"""The prefix cache on and off: a shared system prompt, multi-turn chats, random prompts.

Code: benchmarks/bench_prefix.py; `python -m benchmarks.bench_prefix` runs the same.
Run from the repository root with PYTHONPATH=. or with the project installed (scripts/setup).
"""

import sys

from benchmarks.bench_prefix import main

sys.exit(main())
