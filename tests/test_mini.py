"""The main job end to end: ``demo --scale quick`` runs the mini sweep (every stage kind, two runs
at a time), a SIGKILL midway and a rerun run only the unfinished runs, and the report has the
table, all four figures and the claims."""

from __future__ import annotations

import csv
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

from gqa_jax.experiments import sweep as sweep_lib

REPO = Path(__file__).resolve().parents[1]
MINI = REPO / "experiments" / "mini.py"


def statuses(root: Path) -> dict[str, str]:
    out = {}
    for p in root.glob("*/run.json"):
        try:
            out[p.parent.name] = json.loads(p.read_text())["status"]
        except ValueError:  # being replaced right now
            pass
    return out


def started(log: str) -> list[str]:
    return [line.split("] ")[1].split(" ")[0] for line in log.splitlines() if "running ... (log" in line]


def test_demo_quick_runs_the_mini_sweep_resumes_after_sigkill_and_reports(suite_subset, tmp_path):
    data, env = suite_subset
    # the machine's time lock (locks.TimeGate) in this test's directory: a time run of the user's
    # own (or of another checkout's suite) does not hold the demo's time runs back
    env = dict(env, XDG_CACHE_HOME=str(tmp_path / "cache"))
    root = tmp_path / "mini"
    demo = [
        sys.executable,
        "-m",
        "gqa_jax",
        "demo",
        "--scale",
        "quick",
        "--root",
        str(root),
        "--data-dir",
        str(data),
    ]
    names = [r.name for r in sweep_lib.load_sweep(MINI, ["scale=quick"]).runs]
    stages = {r.name: r.stage for r in sweep_lib.load_sweep(MINI, ["scale=quick"]).runs}
    assert set(stages.values()) == set(sweep_lib.STAGES)  # every stage kind is in the sweep

    proc = subprocess.Popen(demo, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.time() + 600
    while not any(n.startswith("ft_") and s == "running" for n, s in statuses(root).items()):
        assert proc.poll() is None, proc.stdout.read().decode()[-3000:]
        assert time.time() < deadline
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    time.sleep(0.5)  # the killed runner's children die with it
    first = statuses(root)
    done_first = {n for n, s in first.items() if s == "done"}
    assert "running" in first.values() and {"pretrain_large", "pretrain_xxl"} <= done_first

    out = subprocess.run(demo, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-4000:]
    ran = started(out.stderr)
    assert sorted(ran) == sorted(set(names) - done_first)  # only the unfinished runs ran again
    assert all(f"] {n} ({stages[n]}): done before, skipped" in out.stderr for n in done_first)
    assert set(statuses(root).values()) == {"done"} and set(statuses(root)) == set(names)
    # each run's progress line counts the runs done per stage
    assert (
        "done in" in out.stderr
        and "; pretrain 2/2, convert 1/1, uptrain 7/7, finetune 6/6, evaluate 10/10, time 6/6" in out.stderr
    )

    # a time run never shares the machine: no other run's span overlaps its own
    spans = {n: json.loads((root / n / "run.json").read_text()) for n in names if n not in done_first}
    for t in (n for n in spans if stages[n] == "time"):
        for n, x in spans.items():
            if n != t:
                assert x["finished"] <= spans[t]["started"] or x["started"] >= spans[t]["finished"], (t, n)

    # every stage left its outputs
    assert (root / "convert_xxl_k1" / "model" / "manifest.json").is_file()
    assert json.loads((root / "uptrain_large_mqa_first" / "conversion.json").read_text())["method"] == "first"
    assert (root / "ft_mqa_xxl_stdlib_calls_s1" / "best_model").is_dir()
    results = json.loads((root / "eval_mqa_xxl_stdlib_calls_s1" / "results.json").read_text())
    assert results["task"] == "stdlib_calls" and 0 < results["examples"] <= 4  # the subset has 2 dev rows
    timing = json.loads((root / "time_xxl_groups_1" / "timing.json").read_text())
    assert (timing["batch"], timing["input_len"], timing["output_len"], timing["num_kv_heads"]) == (
        16,
        64,
        64,
        1,
    )
    alpha0 = [
        json.loads(line) for line in (root / "uptrain_xxl_k2_a0" / "metrics.jsonl").read_text().splitlines()
    ]
    assert [r["step"] for r in alpha0] == [0] and "eval/loss" in alpha0[0]  # alpha 0: converted, scored

    # the report: Table 1 with the four roles, all four figures, the CSV, the claims
    report = root / "report"
    for fig in ("fig3", "fig4", "fig5", "fig6"):
        png = report / f"{fig}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    md = (report / "report.md").read_text()
    assert out.stdout.strip() == md.strip()  # the demo prints the report
    assert "Runs done: 32 of 32." in md
    for role in ("MHA-Large", "MHA-XXL", "MQA-XXL", "GQA-2-XXL"):
        assert f"| {role} | " in md
    table_lines = [
        line for line in md.split("## The paper's claims")[0].splitlines() if line.startswith("| ")
    ]
    assert table_lines and not [line for line in table_lines if "missing" in line]
    claims = md.split("## The paper's claims")[1]
    verdicts = [
        line.rsplit("|", 2)[1].strip()
        for line in claims.splitlines()
        if line.startswith("| ") and "**" in line
    ]
    assert len(verdicts) == 7  # decode time twice (the decoder's steps, the whole decode), then quality
    judged = ("reproduced", "not reproduced", "within noise", "not testable at this setting")
    assert all(v.strip("*") in judged for v in verdicts)
    sanity, gates = md.split("## Sanity claims")[1].split("## The paper's claims")[0].split("| gate |")
    sanity_verdicts = [line.rsplit("|", 2)[1].strip(" *") for line in sanity.splitlines() if "**" in line]
    assert len(sanity_verdicts) == 4 and all(v in judged[:3] for v in sanity_verdicts)
    gate_verdicts = [line.rsplit("|", 2)[1].strip(" *") for line in gates.splitlines() if "**" in line]
    assert len(gate_verdicts) == 2 and all(v in judged[:3] for v in gate_verdicts)  # measured: never missing
    quality = verdicts[2:]
    assert ("**not testable at this setting**" in quality) == any(v != "reproduced" for v in sanity_verdicts)
    for verdict, gate in zip(verdicts[:2], gate_verdicts, strict=True):  # steps, then whole
        assert (verdict == "**not testable at this setting**") == (gate != "reproduced")
    assert results["loss"] > 0 and len(timing["times_s"]) == len(timing["prefill_times_s"]) == 5
    assert len(timing["steps_times_s"]) == 5 and timing["step_bytes"]["total"] > 0
    rows = list(csv.DictReader((report / "report.csv").open()))
    assert {r["section"] for r in rows} == {"table1", "fig3", "fig4", "fig5", "fig6"}
    mqa = [
        r
        for r in rows
        if r["section"] == "table1" and r["row"] == "MQA-XXL" and r["column"] == "stdlib_calls"
    ]
    assert mqa[0]["n_seeds"] == "2" and mqa[0]["paper"] == ""
