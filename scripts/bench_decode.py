"""Decoding benchmark: ``python scripts/bench_decode.py [options of python -m gqa_jax bench decode]``.

Prints the Markdown tables (a. cache vs none, b. MHA / GQA / MQA, c. the floor, d. HuggingFace)
and writes every number to ``bench_decode.json`` in the current directory unless ``--json``
names another file. ``--help`` lists the options.
"""

from __future__ import annotations

import sys

from gqa_jax.__main__ import main

if __name__ == "__main__":
    argv = sys.argv[1:]
    if not any(a == "--json" or a.startswith("--json=") for a in argv):
        argv += ["--json", "bench_decode.json"]
    sys.exit(main(["bench", "decode", *argv]))
