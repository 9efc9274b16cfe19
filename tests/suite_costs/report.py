"""``python tests/suite_costs/report.py DIR [N]``: the tables of what a measured test run's time
paid for (``DIR``: the ``GQA_JAX_TEST_COSTS`` folder of that run; docs/testing.md): seconds per
category summed over the processes, and the ``N`` (default 15) test files that cost the most.

A subprocess's imports are its start-up. A process's waits on its children (and its sleeps) are
left out of the sums (the children's time is in); ``cpu`` is each process's own CPU time."""

import collections
import json
import sys
from pathlib import Path

COLUMNS = ("compile", "data", "model", "decode", "train", "startup", "import", "rest", "sub_rest")
NAMES = {
    "compile": "compiles: tracing, lowering, XLA (a persistent-cache hit too)",
    "data": "data builds: vocabularies, the stdlib suite",
    "model": "model builds: init, train state",
    "decode": "decoding: greedy, sampling, beam search",
    "train": "training: `train()` runs, train steps",
    "startup": "subprocess start-up: their imports",
    "import": "imports in the pytest workers",
    "rest": "the rest in the pytest workers: test code, I/O",
    "sub_rest": "the rest in subprocesses: I/O, timing loops",
}
WAIT = "waiting on subprocesses or asleep (not in the sum: the subprocesses' own time is)"


def load(folder: Path) -> list[dict]:
    """Every record, a subprocess's given to the test its pytest worker ran when it started."""
    rows = [json.loads(line) for path in sorted(folder.glob("*.jsonl")) for line in path.open()]
    tests = collections.defaultdict(list)  # worker pid -> its tests' (start, end, name)
    for r in rows:
        if r["kind"] == "test":
            tests[str(r["pid"])].append((r["start"], r["end"], r["test"]))
    out = []
    for r in rows:
        if r["kind"] == "process":  # a subprocess (or a worker's end): its imports are its start-up
            spans = tests.get(str(r["worker"]), ())
            r["test"] = next((name for a, b, name in spans if a <= r["start"] < b), None)
            if r["test"] is None or str(r["pid"]) in tests:
                continue  # the controller, a worker after its last test
            r["startup"], r["import"], r["sub_rest"], r["rest"] = r["import"], 0.0, r["other"], 0.0
        else:
            r["startup"], r["sub_rest"], r["rest"] = 0.0, 0.0, r["other"]
        out.append(r)
    return out


def main(folder: str, n: int = 15) -> None:
    rows = load(Path(folder))
    total, by_file = collections.Counter(), collections.defaultdict(collections.Counter)
    for r in rows:
        name = (r["test"] or "(collection)").split("::")[0]
        for c in (*COLUMNS, "cpu", "wait"):
            total[c] += r[c]
            by_file[name][c] += r[c]
        by_file[name]["processes"] += r["kind"] == "process"
    whole = sum(total[c] for c in COLUMNS)
    print(f"{sum(c['processes'] for c in by_file.values())} subprocesses; CPU {total['cpu']:.0f} s\n")
    print("| what | s, summed over processes | share |\n|---|---|---|")
    for c in COLUMNS:
        print(f"| {NAMES[c]} | {total[c]:.0f} | {100 * total[c] / whole:.0f}% |")
    print(f"| all | {whole:.0f} | |\n| {WAIT} | {total['wait']:.0f} | |\n")
    head = ("file", *COLUMNS, "all", "cpu", "processes")
    print("| " + " | ".join(head) + " |\n" + "|---" * len(head) + "|")
    for name, c in sorted(by_file.items(), key=lambda kv: -kv[1]["cpu"])[:n]:
        cells = [f"{c[k]:.0f}" for k in COLUMNS] + [f"{sum(c[k] for k in COLUMNS):.0f}", f"{c['cpu']:.0f}"]
        print(f"| {name} | " + " | ".join(cells) + f" | {c['processes']} |")


if __name__ == "__main__":
    main(sys.argv[1], *map(int, sys.argv[2:3]))
