"""The sweep report (gqa_jax.experiments.report, its parts, claims; the ``report``
command) on fake ROOTs: run directories written here by hand in the runner's formats."""

from __future__ import annotations

import csv
import json
import math
import shutil
from pathlib import Path

import pytest

from gqa_jax.experiments import claims as claims_lib
from gqa_jax.experiments import report, stats
from gqa_jax.experiments.parts import fig3
from gqa_jax.experiments.sweep import Run, Sweep, command, load_sweep

REPO = Path(__file__).resolve().parents[1]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
TASKS = [["cnn_dailymail", "CNN R1", "ROUGE-1"], ["trivia_qa", "TriviaQA F1", "F1"]]
MACHINE = {"backend": "cpu", "devices": ["cpu"], "device_count": 1}
REPEATS = (0.97, 1.0, 1.02)  # a time run's repeats, times its time per sample (their median)
STEPS = 0.8  # a time run's decoder steps alone, as a share of its time
BYTES_PER_SECOND = 1e8  # a time run's bytes model: a step reads this x its time per sample (bytes)


def step_bytes(seconds: float) -> dict[str, int]:
    """The bytes model of a fake time run of ``seconds`` per sample: proportional to it, 10% weights."""
    total = round(seconds * BYTES_PER_SECOND)
    return {
        "weights": total // 10,
        "self_cache": total * 9 // 20,
        "cross_cache": total * 9 // 20,
        "total": total,
    }


# ---------------------------------------------------------------------------------- fake runs
def roofline(seconds: float) -> dict[str, float]:
    """The step roofline of a fake time run of ``seconds`` per sample: half its step's measured
    time (0.8 x seconds x 8 rows / 16 steps), at a machine that reads 1 GB/s."""
    return {"roofline_s": seconds * STEPS / 4, "read_gb_s": 1.0, "matmul_gflop_s": 50.0}


def write_run(root: Path, run: Run, value: float | None = None, status: str = "done") -> None:
    """ROOT/<name>/ as the runner and the stage leave it: run.json, and the stage's number file."""
    d = root / run.name
    d.mkdir(parents=True, exist_ok=True)
    info = {"name": run.name, "stage": run.stage, "command": ["python", "-m", "gqa_jax", *command(run, root)],
            "root": str(root), "tags": dict(run.tags), "status": status, "seconds": 1.0,
            "finished": "2026-01-01"}  # fmt: skip
    (d / "run.json").write_text(json.dumps(info))
    if status != "done" or value is None:
        return
    if run.stage == "evaluate":
        result = {"task": run.tags.get("task"), "split": "validation", "metric": "ROUGE-1",
                  "scores": {"rouge1": value}, "primary": value, "loss": 1.0 / (1.0 + value), "examples": 10,
                  "model": "m"}  # fmt: skip
        (d / "results.json").write_text(json.dumps(result))
    elif run.stage == "time":
        timing = {"time_per_sample_s": value, "times_s": [value * 8 * f for f in REPEATS], "batch": 8,
                  "batch_rule": "given", "input_len": 64, "output_len": 16, "preset": "tiny", "num_heads": 8,
                  "num_kv_heads": 1, "dtype": "float32", "weights": "random", "machine": MACHINE,
                  "steps_times_s": [value * 8 * STEPS * f for f in REPEATS],
                  "step_bytes": step_bytes(value), "step_roofline": roofline(value)}  # fmt: skip
        (d / "timing.json").write_text(json.dumps(timing))
    elif run.stage in ("pretrain", "uptrain", "finetune"):
        lines = [{"step": 10, "train/loss": 9.0}, {"step": 10, "eval/loss": value + 1.0, "eval/seconds": 1.0},
                 {"step": 20, "train/loss": 8.0}, {"step": 20, "eval/loss": value, "eval/seconds": 1.0},
                 {"step": 21, "train/loss": 7.5}]  # fmt: skip
        (d / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))


def fake_root(root: Path, sweep: Sweep, values: dict[str, float], skip: set[str] = frozenset()) -> Path:
    """Every run of ``sweep`` done with its value from ``values`` (0.0 default), but those in ``skip``."""
    for r in sweep.runs:
        if r.name not in skip:
            write_run(root, r, values.get(r.name, 0.0))
    return root


def as_older_timings(root: Path) -> None:
    """Every timing.json under ``root`` as the time stage wrote it before it measured the decoder's
    steps alone, the bytes model and the roofline (no steps_times_s, step_bytes, step_roofline)."""
    later = ("steps_times_s", "step_bytes", "step_roofline")
    for path in root.glob("*/timing.json"):
        timing = json.loads(path.read_text())
        path.write_text(json.dumps({k: v for k, v in timing.items() if k not in later}))


def evaluate_runs(model: str, scores: dict[str, list[float]], **tags) -> tuple[list[Run], dict[str, float]]:
    """``eval_<model>_<task>_s<seed>`` evaluate runs and their scores."""
    runs, values = [], {}
    for task, per_seed in scores.items():
        for seed, v in enumerate(per_seed):
            name = f"eval_{model}_{task}_s{seed}".replace(".", "")
            runs.append(
                Run(
                    name, "evaluate", {"task": task}, (), {"model": model, "task": task, "seed": seed, **tags}
                )
            )
            values[name] = v
    return runs, values


PAPER_ROWS = {
    "MHA-Large": {"time": 0.37, "average": 46.0, "scores": {"cnn_dailymail": 42.9, "trivia_qa": 78.2}},
    "MHA-XXL": {"time": 1.51, "average": 47.2, "scores": {"cnn_dailymail": 43.8, "trivia_qa": 81.9}},
    "MQA-XXL": {"time": 0.24, "average": 46.6, "scores": {"cnn_dailymail": 43.0, "trivia_qa": 81.3}},
    "GQA-8-XXL": {"time": 0.28, "average": 47.1, "scores": {"cnn_dailymail": 43.5, "trivia_qa": 81.6}},
}
OURS_TABLE = {  # model -> ({task: [seed values]}, time per sample)
    "MHA-Large": ({"cnn_dailymail": [40.0, 42.0], "trivia_qa": [70.0, 74.0]}, 0.30),
    "MHA-XXL": ({"cnn_dailymail": [43.0, 43.0], "trivia_qa": [80.0, 81.0]}, 1.20),
    "MQA-XXL": ({"cnn_dailymail": [41.0, 43.0], "trivia_qa": [78.0, 82.0]}, 0.20),
    "GQA-8-XXL": ({"cnn_dailymail": [42.5, 42.7], "trivia_qa": [80.0, 80.4]}, 0.25),
}


def table_runs(paper_rows=PAPER_ROWS, ours=OURS_TABLE, **tags) -> tuple[list[Run], dict[str, float]]:
    runs, values = [], {}
    for model, (scores, seconds) in ours.items():
        r, v = evaluate_runs(model, scores, **tags)
        runs += r
        values |= v
        for lengths, factor in (("512/256", 0.5), ("2048/512", 1.5)):  # T_infer: the mean of the two
            name = f"time_{model}_{lengths.replace('/', '_')}"
            runs.append(Run(name, "time", {"preset": "tiny"}, (), {"model": model, "lengths": lengths}))
            values[name] = seconds * factor
    return runs, values


def table_sweep() -> tuple[Sweep, dict[str, float]]:
    runs, values = table_runs()
    return Sweep("table1", tuple(runs), {"tasks": TASKS, "rows": PAPER_ROWS}), values


def read_csv(path: Path) -> list[dict[str, str]]:
    with open(path) as f:
        return list(csv.DictReader(f))


def csv_value(rows, section, row, column) -> dict[str, str]:
    found = [r for r in rows if (r["section"], r["row"], r["column"]) == (section, row, column)]
    assert len(found) == 1, (section, row, column, found)
    return found[0]


def check_png(path: Path) -> None:
    import matplotlib.image

    assert path.read_bytes()[:8] == PNG_MAGIC, path
    image = matplotlib.image.imread(path)
    assert image.ndim == 3 and image.shape[0] > 200 and image.shape[1] > 300, image.shape


def keep_png(path: Path, name: str) -> None:
    """A copy under /tmp/report_pngs/ to look at."""
    out = Path("/tmp/report_pngs")
    out.mkdir(exist_ok=True)
    shutil.copy(path, out / name)


# ---------------------------------------------------------------------------------- numbers
def test_stat_is_mean_and_sample_std_and_a_mean_over_tasks_missing_when_a_task_is():
    s = stats.stat({0: 40.0, 1: 42.0, 2: 47.0}, 3)
    assert s.mean == pytest.approx(43.0) and s.std == pytest.approx(math.sqrt(13.0)) and s.n == 3
    one = stats.stat({0: 5.0}, 2)
    assert one.std is None and one.n == 1 and one.expected == 2
    assert stats.stat({}, 2).missing
    a, b = stats.stat({0: 40.0, 1: 42.0}, 2), stats.stat({0: 70.0, 1: 74.0}, 2)
    m = stats.mean_of([a, b])
    assert m.mean == pytest.approx(56.5)
    assert m.std == pytest.approx(abs(55.0 - 58.0) / math.sqrt(2))  # the per-seed means: 55 and 58
    assert stats.mean_of([a, stats.stat({}, 2)]).missing


def test_verdict_rule():
    assert claims_lib.verdict(1.0, 0.5) == "reproduced"
    assert claims_lib.verdict(0.3, 0.5) == "within noise"
    assert claims_lib.verdict(-0.3, 0.5) == "within noise"
    assert claims_lib.verdict(-1.0, 0.5) == "not reproduced"
    assert claims_lib.verdict(0.0, 0.0, strict=False) == "reproduced"
    assert claims_lib.verdict(0.0, 0.0) == "within noise"
    assert claims_lib.worst(["reproduced", "within noise"]) == "within noise"
    assert claims_lib.worst(["within noise", "not reproduced", "missing"]) == "missing"
    assert claims_lib.pick(["MHA-Large", "MHA-XXL", "GQA-8-XXL"], "MHA", like="GQA-8-XXL") == "MHA-XXL"
    assert claims_lib.pick(["MHA", "GQA-2", "MQA"], "MHA", like="GQA-2") == "MHA"


def test_a_claims_noise_is_never_below_the_spread_across_machines():
    """One seed each, 4.81420 against 4.81425 (a loss): by the seeds alone 5e-5 apart is reproduced;
    within the machines' spread of a loss it is within noise, and the claim resolves that spread."""
    a, b = stats.stat({0: 4.81420}, 1), stats.stat({0: 4.81425}, 1)
    loss = claims_lib.MACHINE["loss"]
    assert claims_lib.compare(a, b, higher=False) == "reproduced"
    assert claims_lib.compare(a, b, higher=False, floor=loss) == "within noise"
    assert claims_lib.resolvable(a, b) is None and claims_lib.resolvable(a, b, loss) == loss
    # a decoded score 0.3 points apart, one seed each: within the 0.5 points scores move by
    f1, f1_other = stats.stat({0: 16.74}, 1), stats.stat({0: 16.44}, 1)
    claim = claims_lib.chain(
        "c", ("A", "B"), (f1, f1_other), "", higher=True, floor=claims_lib.MACHINE["score"]
    )
    assert (claim.verdict, claim.resolution()) == ("within noise", "0.5")
    # with seeds spread beyond the floor, the seeds' noise is the rule's
    seeds = stats.stat({0: 16.0, 1: 18.0}, 2)
    assert claims_lib.resolvable(seeds, seeds, 0.5) == pytest.approx(2.0)
    # the measured spreads are inside the floors (docs/results/determinism.md)
    assert 2.9e-5 < claims_lib.MACHINE["loss"] and 0.13 < claims_lib.MACHINE["score"]


# ---------------------------------------------------------------------------------- table 1
def test_table1_rows_in_the_paper_order_with_mean_std_missing_and_fig3(tmp_path):
    sweep, values = table_sweep()
    skip = {"eval_MHA-Large_trivia_qa_s0", "eval_MHA-Large_trivia_qa_s1", "eval_MQA-XXL_cnn_dailymail_s1"}
    root = fake_root(tmp_path / "root", sweep, values, skip=skip)
    written = report.write_report(sweep, root)
    assert set(written) == {"report.md", "report.csv", "fig3"}
    assert written["report.md"].parent == root / "report"
    md = written["report.md"].read_text()
    table = md.split("## Table 1")[1].split("##")[0].split("Speed-up")[0]
    lines = [line for line in table.splitlines() if line.startswith("| ")]
    header = "| model | T_infer (s) | decoder steps alone (s) | CNN R1 | TriviaQA F1 | Average (paper) |"
    assert lines[0].startswith(header)
    assert [line.split(" | ")[0][2:] for line in lines[1:]] == list(PAPER_ROWS)
    mha_large, mha_xxl, mqa, gqa = lines[1:]
    assert "41.00 ± 1.41, n=2 (42.9)" in mha_large  # seeds 40 and 42
    assert "missing (78.2)" in mha_large  # both trivia_qa runs missing
    assert mha_large.rstrip(" |").endswith("missing (60.55)")  # so is the mean over tasks
    assert "41.00, n=1 of 2 (43.0)" in mqa  # one of two seeds done
    assert (
        "0.3 ± 0.00755, n=3 (0.37)" in mha_large
    )  # T_infer: the mean of 0.15 and 0.45 (the repeats' medians)
    assert "| 47.2 |" in mha_xxl  # the paper's Average
    assert "61.40 ± 0.21, n=2 (62.55)" in gqa  # per-seed means 61.25 and 61.55
    rows = read_csv(written["report.csv"])
    assert list(rows[0]) == list(report.CSV_COLUMNS)
    cnn = csv_value(rows, "table1", "MHA-Large", "cnn_dailymail")
    assert float(cnn["ours_mean"]) == 41.0 and float(cnn["ours_std"]) == pytest.approx(math.sqrt(2))
    assert cnn["n_seeds"] == "2" and float(cnn["paper"]) == 42.9
    gone = csv_value(rows, "table1", "MHA-Large", "trivia_qa")
    assert gone["ours_mean"] == "" and gone["n_seeds"] == "0"
    assert float(csv_value(rows, "table1", "GQA-8-XXL", "T_infer_s")["ours_mean"]) == pytest.approx(0.25)
    assert float(csv_value(rows, "fig3", "GQA-8-XXL", "average_score")["ours_mean"]) == pytest.approx(61.4)
    assert float(csv_value(rows, "fig3", "GQA-8-XXL", "average_score")["paper"]) == 47.1
    assert csv_value(rows, "fig3", "MHA-Large", "average_score")["ours_mean"] == ""  # not plotted: missing
    assert "## The paper's claims" not in md  # only the mini tests claims
    check_png(written["fig3"])
    keep_png(written["fig3"], "fig3_table1.png")


def test_fig3_puts_ours_and_the_papers_points_on_one_plot_when_the_scales_match(tmp_path):
    sweep, values = table_sweep()
    values |= {r.name: values[r.name] - 15.0 for r in sweep.runs if r.stage == "evaluate"}  # near the paper's
    numbers = report.compute(sweep, fake_root(tmp_path, sweep, values))
    data = numbers["fig3"]
    assert [p.model for p in data.ours] == list(PAPER_ROWS) and [m for m, *_ in data.paper] == list(
        PAPER_ROWS
    )
    assert fig3.PART.figure(data, tmp_path / "fig3.png") == tmp_path / "fig3.png"
    check_png(tmp_path / "fig3.png")
    keep_png(tmp_path / "fig3.png", "fig3_shared.png")


@pytest.mark.parametrize("offset", [15.0, 0.0])  # one plot (ours near the paper's), a panel each
def test_fig3_names_the_papers_point_by_the_papers_model_where_ours_stands_for_another(tmp_path, offset):
    """The mini's GQA-2-XXL stands for the paper's GQA-8-XXL: the paper's point says GQA-8-XXL."""
    ours = {("GQA-2-XXL" if m == "GQA-8-XXL" else m): v for m, v in OURS_TABLE.items()}
    rows = {m: dict(PAPER_ROWS[m]) for m in PAPER_ROWS}
    rows["GQA-2-XXL"] = rows.pop("GQA-8-XXL") | {"name": "GQA-8-XXL"}
    runs, values = table_runs(ours=ours)
    sweep = Sweep("table1", tuple(runs), {"tasks": TASKS, "rows": rows})
    values |= {r.name: values[r.name] - offset for r in sweep.runs if r.stage == "evaluate"}
    data = report.compute(sweep, fake_root(tmp_path, sweep, values))["fig3"]
    assert ("GQA-2-XXL", "GQA-8-XXL") in [(m, name) for m, name, *_ in data.paper]
    fig = fig3.draw(data)
    texts = [t.get_text() for ax in fig.axes for t in ax.texts]
    texts += [t.get_text() for ax in fig.axes if ax.get_legend() for t in ax.get_legend().get_texts()]
    assert len(fig.axes) == (1 if offset else 2)
    assert "GQA-8-XXL (paper)" in texts and "GQA-2-XXL (paper)" not in texts


def test_a_sweep_file_through_load_sweep_and_the_command(tmp_path, capsys):
    from gqa_jax.cli import options
    from gqa_jax.cli import report as cli_report

    file = tmp_path / "table_small.py"
    file.write_text(
        "from gqa_jax.experiments.sweep import Run, Sweep\n"
        "PARAMS = {'seeds': 2}\n"
        "def get_sweep(params):\n"
        "    runs = []\n"
        "    for m in ('MHA', 'GQA-2', 'MQA'):\n"
        "        for s in range(params['seeds']):\n"
        "            runs.append(Run(f'eval_{m}_s{s}', 'evaluate', {'task': 'docsum', 'batch_size': 4}, (),\n"
        "                            {'model': m, 'task': 'docsum', 'seed': s}))\n"
        "        runs.append(Run(f'time_{m}', 'time', {'batch_size': 4}, (), {'model': m}))\n"
        "    paper = {'tasks': [['docsum', 'DocSum R1', 'ROUGE-1']], 'rows': {}}\n"
        "    return Sweep('table1', tuple(runs), paper)\n"
    )
    sweep = load_sweep(file, ["seeds=1", "batch_size=8"])
    assert len(sweep.runs) == 6
    root = fake_root(tmp_path / "root", sweep, {"eval_MHA_s0": 12.0, "eval_GQA-2_s0": 11.0, "time_MHA": 0.02})
    p = options.Parser(prog="report")
    cli_report.add_args(p)
    sets = ["--set", "seeds=1", "--set", "batch_size=8"]
    args = p.parse_args([str(file), "--root", str(root), "--out", str(tmp_path / "out"), *sets])
    assert cli_report.run(args) == 0
    out = capsys.readouterr().out
    assert (
        "| MHA | 0.02 ± 0.000503, n=3 | 12.00 |" in out and f"wrote {tmp_path / 'out' / 'report.csv'}" in out
    )
    assert (tmp_path / "out" / "fig3.png").is_file()
    with pytest.raises(ValueError, match=r"run the sweep first"):
        cli_report.run(p.parse_args([str(file), "--root", str(tmp_path / "empty")]))
    # what sweep refuses, report refuses: runs made with other --set (a partial redo alike), or a
    # root that holds only another setting's runs; nothing is written
    with pytest.raises(ValueError, match=r"^6 run\(s\) under .* another command .* no report was written$"):
        cli_report.run(
            p.parse_args([str(file), "--root", str(root), "--out", str(tmp_path / "o2"), "--set", "seeds=1"])
        )
    other = tmp_path / "other"
    (other / "pretrain_x").mkdir(parents=True)
    (other / "pretrain_x" / "run.json").write_text(json.dumps({"status": "done"}))
    with pytest.raises(ValueError, match=r"none of the 6 runs .* holds 1 other run\(s\) \(pretrain_x\)"):
        cli_report.run(p.parse_args([str(file), "--root", str(other), "--out", str(tmp_path / "o3"), *sets]))
    assert not (tmp_path / "o2").exists() and not (tmp_path / "o3").exists()


def test_an_empty_root_is_a_clear_error(tmp_path):
    sweep, _ = table_sweep()
    (tmp_path / "root").mkdir()
    (tmp_path / "root" / "stray").mkdir()
    with pytest.raises(
        ValueError, match=r"--root .*root holds no run directory of sweep table1.*run the sweep first"
    ):
        report.write_report(sweep, tmp_path / "root")
    assert not (tmp_path / "root" / "report").exists()


def test_a_file_where_the_report_or_the_demos_directories_go_is_named_first(tmp_path, monkeypatch):
    """A file as --out (report), --root or --data-dir (demo) is one clear error before any work:
    the demo builds no data and runs nothing, the file is left as it was."""
    from gqa_jax import reproduce

    sweep, values = table_sweep()
    root = fake_root(tmp_path / "root", sweep, values)
    afile = tmp_path / "afile"
    afile.write_text("mine")
    with pytest.raises(ValueError, match=f"the report's directory {afile} is a file"):
        report.write_report(sweep, root, afile)
    built = []
    monkeypatch.setattr(reproduce.stdlib_suite, "build_suite", lambda *a, **k: built.append(a))
    for kwargs, flag in (
        ({"root": afile}, "--root"),
        ({"root": tmp_path / "r", "data_dir": str(afile)}, "--data-dir"),
    ):
        with pytest.raises(ValueError, match=f"{flag} {afile} is a file, not a directory"):
            reproduce.run(scale="quick", log=lambda m: None, **kwargs)
    assert not built and afile.read_text() == "mine" and not (tmp_path / "r").exists()


# ---------------------------------------------------------------------------------- figures 4-6
def fig4_sweep():
    runs, values = [], {}
    scores = {"mean": (44.0, 80.0), "first": (42.0, 78.0), "random": (30.0, 60.0)}
    for method, (cnn, tqa) in scores.items():
        runs.append(
            Run(f"uptrain_{method}", "uptrain", {"config": "configs/uptrain.py"}, (), {"method": method})
        )
        r, v = evaluate_runs(
            "MQA-Large", {"cnn_dailymail": [cnn, cnn + 1], "trivia_qa": [tqa]}, method=method
        )
        runs += [Run(x.name + f"_{method}", x.stage, x.args, x.deps, x.tags) for x in r]
        values |= {k + f"_{method}": x for k, x in v.items()}
    paper = {"tasks": TASKS, "methods": ["mean", "first", "random"], "claim": "Mean > First > Random"}
    return Sweep("fig4_conversion", tuple(runs), paper), values


def test_fig4_bars_per_method_and_task_plus_mean(tmp_path):
    sweep, values = fig4_sweep()
    root = fake_root(tmp_path, sweep, values, skip={"eval_MQA-Large_trivia_qa_s0_random"})
    written = report.write_report(sweep, root, tmp_path / "out")
    assert set(written) == {"report.md", "report.csv", "fig4"}
    rows = read_csv(written["report.csv"])
    mean_cnn = csv_value(rows, "fig4", "mean", "cnn_dailymail")
    assert float(mean_cnn["ours_mean"]) == 44.5 and float(mean_cnn["ours_std"]) == pytest.approx(
        math.sqrt(0.5)
    )
    assert float(csv_value(rows, "fig4", "first", "mean")["ours_mean"]) == pytest.approx((42.5 + 78.0) / 2)
    assert csv_value(rows, "fig4", "random", "trivia_qa")["n_seeds"] == "0"
    assert csv_value(rows, "fig4", "random", "mean")["ours_mean"] == ""
    md = written["report.md"].read_text()
    assert (
        "| method | CNN R1 | TriviaQA F1 | mean |" in md
        and "| random | 30.50 ± 0.71, n=2 | missing | missing |" in md
    )
    assert "Table 1" not in md and "fig4.png" in md
    check_png(written["fig4"])
    keep_png(written["fig4"], "fig4_conversion.png")


def fig5_sweep():
    runs, values = [], {}
    ours = {"MQA-XXL": (30.0, 44.0, 45.0), "GQA-8-XXL": (42.0, 46.0, 46.5)}
    for model, scores in ours.items():
        for alpha, score in zip((0.0, 0.05, 0.1), scores, strict=True):
            r, v = evaluate_runs(f"{model}_a{alpha:g}", {"cnn_dailymail": [score], "trivia_qa": [score + 30]},
                                 alpha=alpha)  # fmt: skip
            runs += [Run(x.name, x.stage, x.args, x.deps, {**x.tags, "model": model}) for x in r]
            values |= v
    r, v = evaluate_runs("MHA-XXL", {"cnn_dailymail": [47.0], "trivia_qa": [77.0]})
    runs += r
    values |= v
    paper = {
        "tasks": TASKS,
        "alphas": [0, 0.05, 0.1],
        "models": ["MQA-XXL", "GQA-8-XXL"],
        "reference": "MHA-XXL",
    }
    return Sweep("fig5_alpha", tuple(runs), paper), values


def test_fig5_score_vs_alpha_with_the_mha_reference(tmp_path):
    sweep, values = fig5_sweep()
    written = report.write_report(sweep, fake_root(tmp_path, sweep, values))
    rows = read_csv(written["report.csv"])
    assert float(csv_value(rows, "fig5", "MQA-XXL", "alpha=0")["ours_mean"]) == 45.0  # (30 + 60) / 2
    assert float(csv_value(rows, "fig5", "GQA-8-XXL", "alpha=0.1")["ours_mean"]) == 61.5
    assert float(csv_value(rows, "fig5", "MHA-XXL", "reference")["ours_mean"]) == 62.0
    md = written["report.md"].read_text()
    assert "| model | alpha 0 | alpha 0.05 | alpha 0.1 |" in md and "MHA-XXL (reference)" in md
    check_png(written["fig5"])
    keep_png(written["fig5"], "fig5_alpha.png")


def fig6_sweep(groups=(1, 4, 8, 16, 32, 64)):
    runs = tuple(Run(f"time_k{k}", "time", {"num_kv_heads": k}, (), {"groups": k}) for k in groups)
    values = {f"time_k{k}": 0.2 + 0.02 * k for k in groups}
    paper = {"groups": list(groups), "reference_groups": max(groups), "input_len": 2048, "output_len": 512}
    return Sweep("fig6_groups", runs, paper), values


def test_fig6_time_vs_groups(tmp_path):
    sweep, values = fig6_sweep()
    written = report.write_report(sweep, fake_root(tmp_path, sweep, values, skip={"time_k16"}))
    rows = read_csv(written["report.csv"])
    for k in (1, 4, 8, 32, 64):
        assert float(
            csv_value(rows, "fig6", f"groups={k}", "time_per_sample_s")["ours_mean"]
        ) == pytest.approx(values[f"time_k{k}"])
    assert csv_value(rows, "fig6", "groups=16", "time_per_sample_s")["ours_mean"] == ""
    md = written["report.md"].read_text()
    assert (
        "| 64 (MHA) | 1.48 ± 0.0372, n=3 |" in md
        and "| 16 | missing |" in md
        and "input 2048, output 512" in md
    )
    check_png(written["fig6"])
    keep_png(written["fig6"], "fig6_groups.png")


def test_fig6_has_a_line_per_kv_cache_and_the_quantized_over_float_ratio(tmp_path):
    caches = (("", {}), ("_int8", {"cache": "int8"}))
    runs = tuple(Run(f"time_k{k}{sfx}", "time", {}, (), {"groups": k, **tags}) for sfx, tags in caches
                 for k in (1, 4, 8))  # fmt: skip
    values = {f"time_k{k}": 0.2 * k for k in (1, 4, 8)} | {f"time_k{k}_int8": 0.1 * k for k in (1, 4, 8)}
    paper = {"groups": [1, 4, 8], "reference_groups": 8, "caches": ["float", "int8"]}
    sweep = Sweep("fig6_groups", runs, paper)
    written = report.write_report(sweep, fake_root(tmp_path, sweep, values, skip={"time_k8_int8"}))
    rows = read_csv(written["report.csv"])
    assert float(csv_value(rows, "fig6", "groups=4", "time_per_sample_s")["ours_mean"]) == pytest.approx(0.8)
    int8 = "time_per_sample_s[int8 cache]"
    assert float(csv_value(rows, "fig6", "groups=4", int8)["ours_mean"]) == pytest.approx(0.4)
    assert csv_value(rows, "fig6", "groups=8", int8)["ours_mean"] == ""
    md = written["report.md"].read_text()
    header = "| groups | float cache: time per sample (s) | int8 cache: time per sample (s) | int8 / float |"
    assert header in md
    assert "| 4 | 0.8 ± 0.0201, n=3 | 0.4 ± 0.0101, n=3 | 0.500 |" in md
    assert "| 8 (MHA) | 1.6 ± 0.0403, n=3 | missing | missing |" in md
    fig = report.compute(sweep, tmp_path)["fig6"]
    assert fig.reference.mean == pytest.approx(1.6)  # MHA's reference line is the float cache's
    check_png(written["fig6"])
    keep_png(written["fig6"], "fig6_caches.png")


# ---------------------------------------------------------------------------------- the mini
MINI_TABLE = {  # MQA: the most spread over seeds; GQA a hair above MHA (within noise)
    "MHA": ({"docsum": [20.0, 20.4], "codesum": [30.0, 30.2]}, 0.040),
    "GQA-2": ({"docsum": [20.1, 20.5], "codesum": [30.1, 30.3]}, 0.025),
    "MQA": ({"docsum": [17.0, 19.0], "codesum": [27.0, 29.0]}, 0.020),
}


def mini_sweep() -> tuple[Sweep, dict[str, float]]:
    runs, values = table_runs(ours=MINI_TABLE)
    runs.append(Run("pretrain_mha", "pretrain", {"config": "c"}, (), {"model": "MHA"}))
    values["pretrain_mha"] = 3.00
    for seed in (0, 1):
        for method, loss in (("mean", 3.10), ("first", 3.40), ("random", 4.00)):
            name = f"up_mqa_{method}_s{seed}"
            runs.append(
                Run(name, "uptrain", {"config": "c"}, (), {"model": "MQA", "method": method, "seed": seed})
            )
            values[name] = loss + 0.01 * seed
        for model, losses in (("MQA", (4.5, 3.2, 3.1)), ("GQA-2", (3.3, 3.05, 3.02))):
            for alpha, loss in zip((0.0, 0.05, 0.1), losses, strict=True):
                name = f"up_{model}_a{alpha:g}_s{seed}"
                runs.append(
                    Run(name, "uptrain", {"config": "c"}, (), {"model": model, "alpha": alpha, "seed": seed})
                )
                values[name] = loss + 0.01 * seed
    for k in (1, 2, 4, 8):
        tags = {"groups": k} | ({"model": "MQA"} if k == 1 else {})  # Fig. 6's, not the table's
        runs.append(Run(f"time_k{k}", "time", {}, (), tags))
        values[f"time_k{k}"] = 0.01 * (1 + k / 4)
    proxy = "dev span-corruption loss"
    paper = {
        "table1": {"tasks": [["docsum", "DocSum R1", "ROUGE-1"], ["codesum", "CodeSum R1", "ROUGE-1"]],
                   "rows": {"MHA": {}, "GQA-2": {}, "MQA": {}}},
        "fig4": {"methods": ["mean", "first", "random"], "claim": "Mean > First > Random"},
        "fig5": {"alphas": [0, 0.05, 0.1], "models": ["MQA", "GQA-2"], "reference": "MHA"},
        "fig6": {"groups": [1, 2, 4, 8], "reference_groups": 8, "input_len": 64, "output_len": 16},
        "proxy": {"fig4": proxy, "fig5": proxy},
    }  # fmt: skip
    return Sweep("mini", tuple(runs), paper), values


ON_PROXY = "; on the proxy, dev span-corruption loss (lower is better)"


def claim_rows(md: str) -> dict[str, str]:
    section = md.split("## The paper's claims")[1]
    return {line.split(" | ")[0][2:]: line.split(" | ")[-1].strip(" |*") for line in section.splitlines()
            if line.startswith("| ") and not line.startswith("| claim")}  # fmt: skip


def test_the_mini_has_every_figure_proxies_and_the_claims(tmp_path):
    sweep, values = mini_sweep()
    written = report.write_report(sweep, fake_root(tmp_path, sweep, values))
    assert set(written) == {"report.md", "report.csv", "fig3", "fig4", "fig5", "fig6"}
    for key in ("fig3", "fig4", "fig5", "fig6"):
        check_png(written[key])
        keep_png(written[key], f"{key}_mini.png")
    md = written["report.md"].read_text()
    titles = [line for line in md.splitlines() if line.startswith("## ")]
    assert [t[3:9] for t in titles if "(proxy: dev span-corruption loss, lower is better)" in t] == [
        "Fig. 4",
        "Fig. 5",
    ]
    assert "Scored on a proxy: dev span-corruption loss" in md
    rows = read_csv(written["report.csv"])
    mean = csv_value(rows, "fig4", "mean", "dev span-corruption loss")
    assert float(mean["ours_mean"]) == pytest.approx(3.105) and mean["n_seeds"] == "2"
    assert float(csv_value(rows, "fig5", "MQA", "alpha=0")["ours_mean"]) == pytest.approx(4.505)
    assert float(csv_value(rows, "fig5", "MHA", "reference")["ours_mean"]) == 3.0
    assert float(csv_value(rows, "table1", "MQA", "docsum")["ours_mean"]) == 18.0  # uptrain runs not in it
    assert float(csv_value(rows, "table1", "MQA", "T_infer_s")["ours_mean"]) == pytest.approx(0.02)
    assert len([r for r in rows if r["section"] == "fig6"]) == 8  # each time and its decoder steps
    verdicts = claim_rows(md)
    assert verdicts == {
        "decode time MQA < GQA < MHA (the time runs: the decoder's steps alone)": "reproduced",
        "decode time MQA < GQA < MHA (the time runs: the whole decode)": "reproduced",
        f"conversion Mean > First > Random (Fig. 4 data){ON_PROXY}": "reproduced",
        f"at alpha 0, GQA is closer to MHA than MQA is (Fig. 5 data){ON_PROXY}": "reproduced",
        "quality MHA ≥ GQA ≥ MQA after uptraining (Table 1, plain mean)": "within noise",
        "quality MHA ≥ GQA ≥ MQA after uptraining (Table 1, dev loss: lower is better)": "within noise",
        "MQA less stable than GQA: more spread over seeds (Table 1 data)": "reproduced",
    }
    assert claims_lib.RULE in md


def test_the_mini_with_runs_missing_says_missing(tmp_path):
    sweep, values = mini_sweep()
    skip = {r.name for r in sweep.runs if "method" in r.tags and r.tags["method"] == "first"}
    skip |= {"eval_MQA_docsum_s1", "time_GQA-2_512_256"}
    written = report.write_report(sweep, fake_root(tmp_path, sweep, values, skip=skip))
    md = written["report.md"].read_text()
    verdicts = claim_rows(md)
    assert verdicts["decode time MQA < GQA < MHA (the time runs: the whole decode)"] == "missing"
    assert verdicts["decode time MQA < GQA < MHA (the time runs: the decoder's steps alone)"] == "missing"
    assert verdicts[f"conversion Mean > First > Random (Fig. 4 data){ON_PROXY}"] == "missing"
    assert verdicts["MQA less stable than GQA: more spread over seeds (Table 1 data)"] == "missing"
    assert verdicts[f"at alpha 0, GQA is closer to MHA than MQA is (Fig. 5 data){ON_PROXY}"] == "reproduced"
    assert "| first | missing |" in md and "Not done: " in md
    for key in ("fig3", "fig4", "fig5", "fig6"):
        check_png(written[key])
    keep_png(written["fig4"], "fig4_mini_missing.png")


def test_in_a_mini_without_proxies_evaluate_runs_tagged_method_or_alpha_are_the_figures(tmp_path):
    tags = {"model": "MQA", "task": "docsum", "seed": 0}
    runs = (
        Run("eval_mqa", "evaluate", {}, (), tags),
        Run("eval_mqa_first", "evaluate", {}, (), {**tags, "method": "first"}),
        Run("eval_mqa_a0", "evaluate", {}, (), {**tags, "alpha": 0}),
    )
    tasks = [["docsum", "DocSum R1", "ROUGE-1"]]
    paper = {"table1": {"tasks": tasks}, "fig4": {"tasks": tasks}, "fig5": {"tasks": tasks, "alphas": [0]}}
    sweep = Sweep("mini", runs, paper)
    root = fake_root(tmp_path, sweep, {"eval_mqa": 20.0, "eval_mqa_first": 15.0, "eval_mqa_a0": 5.0})
    numbers = report.compute(sweep, root)
    assert [r.model for r in numbers["table1"].rows] == ["MQA"]
    assert numbers["table1"].row("MQA").scores["docsum"].mean == 20.0
    assert numbers["fig4"].bars["first"][0].mean == 15.0
    assert numbers["fig5"].lines["MQA"][0].mean == 5.0
    assert numbers["fig6"].times == () and numbers["claims"].claims[0].verdict == "missing"


# ---------------------------------------------------------------------------------- the real sweep files
@pytest.mark.parametrize("name", ["table1", "fig4_conversion", "fig5_alpha", "fig6_groups"])
def test_the_repository_sweep_files_report_with_every_run_done(tmp_path, name):
    sweep = load_sweep(REPO / "experiments" / f"{name}.py")
    values = {r.name: 1.0 + i % 7 for i, r in enumerate(sweep.runs)}
    written = report.write_report(sweep, fake_root(tmp_path, sweep, values))
    md = written["report.md"].read_text()
    assert f"Runs done: {len(sweep.runs)} of {len(sweep.runs)}." in md
    assert "missing" not in md.split("## ", 1)[1]
    rows = read_csv(written["report.csv"])
    assert rows and all(r["n_seeds"] != "0" for r in rows if r["column"] != "paper_average")
    for key, path in written.items():
        if key.startswith("fig"):
            check_png(path)


def test_fig4_on_the_proxy_shows_the_converted_and_the_uptrained_loss_over_seeds(tmp_path):
    """The mini's Fig. 4 uptrainings evaluated at step 0 too (eval_at_start): a bar of the
    converted model beside the uptrained one, each a mean over the seeds; the claim still reads
    the uptrained bars."""
    sweep, values = mini_sweep()
    root = fake_root(tmp_path, sweep, values)
    starts = {"mean": 6.0, "first": 6.3, "random": 8.0}
    for run in sweep.runs:
        if run.stage == "uptrain" and "method" in run.tags:  # the step-0 evaluation comes first
            metrics = root / run.name / "metrics.jsonl"
            first = json.dumps({"step": 0, "eval/loss": starts[run.tags["method"]] + 0.1 * run.tags["seed"]})
            metrics.write_text(first + "\n" + metrics.read_text())
    fig4 = report.compute(sweep, root)["fig4"]
    proxy = "dev span-corruption loss"
    assert fig4.columns == ("converted", proxy) and fig4.groups == ("converted (step 0)", "uptrained")
    converted, uptrained = fig4.bars["mean"]
    assert converted.mean == pytest.approx(6.05) and converted.n == 2
    assert converted.std == pytest.approx(0.0707, abs=1e-3)
    assert uptrained.mean == pytest.approx(3.105) and uptrained.n == 2
    written = report.write_report(sweep, root)
    rows = read_csv(written["report.csv"])
    assert float(csv_value(rows, "fig4", "first", "converted")["ours_mean"]) == pytest.approx(6.35)
    verdicts = claim_rows(written["report.md"].read_text())
    assert verdicts["conversion Mean > First > Random (Fig. 4 data)" + ON_PROXY] == "reproduced"
    check_png(written["fig4"])


@pytest.mark.parametrize("n_methods", [3, 9])
def test_fig4_keeps_its_legend_off_the_bars_and_its_values_apart(n_methods):
    """Every method (``methods=all``: nine bars a group) once put the legend over the bars and the
    values on top of one another: the legend now sits beside the axes and no two values overlap."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from gqa_jax.experiments.parts import fig4

    methods = ["mean", "first", "random", "grouped", "aligned", "svd", "medoid", "a-b", "c-d"][:n_methods]
    bars = {m: (stats.Stat(6.085 + 0.117 * j, 0.2, 3, 3), stats.Stat(4.839 + 0.013 * j, 0.02, 3, 3))
            for j, m in enumerate(methods)}  # fmt: skip
    result = fig4.Fig4("Fig. 4", "dev loss", ("converted (step 0)", "uptrained"), ("converted", "loss"),
                       bars, {}, "dev loss")  # fmt: skip
    fig = fig4.draw(result)
    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw(renderer)
    (ax,) = fig.axes
    assert ax.get_legend().get_window_extent(renderer).x0 >= ax.get_window_extent(renderer).x1
    values = [t for t in ax.texts if t.get_text()[:1].isdigit()]
    assert len(values) == 2 * n_methods
    boxes = [t.get_window_extent(renderer) for t in values]
    assert not [(a, b) for i, a in enumerate(boxes) for b in boxes[i + 1 :] if a.overlaps(b)]


def test_fig4_ranks_the_methods_per_column_against_mean_with_the_seeds_spread():
    S = stats.stat
    bars = {
        "mean": [S({0: 6.0, 1: 6.0}, 2), S({0: 4.80, 1: 4.86}, 2)],
        "svd": [S({0: 4.8, 1: 4.8}, 2), S({0: 4.68, 1: 4.70}, 2)],  # beyond the spread
        "first": [S({0: 6.3, 1: 6.3}, 2), S({0: 4.82, 1: 4.90}, 2)],  # within it
        "random": [S({0: 8.4}, 2), S({}, 2)],  # one seed; missing
        "grouped": [S({0: 6.0000000001, 1: 6.0000000001}, 2), S({0: 4.80, 1: 4.86}, 2)],  # = mean
    }
    ranking = stats.rank_methods(bars, ["converted", "uptrained"], lower_is_better=True)
    converted, uptrained = ranking["converted"], ranking["uptrained"]
    assert [(m, v) for m, _, v in converted] == [
        ("svd", "better (every seed the same: no spread)"),
        ("mean", "baseline"),
        ("grouped", "equal"),
        ("first", "worse (every seed the same: no spread)"),
        ("random", "worse (one seed: no spread)"),
    ]
    assert [(m, v) for m, _, v in uptrained] == [
        ("svd", "better, beyond the spread"),
        ("mean", "baseline"),
        ("grouped", "equal"),
        ("first", "worse, within the spread"),
        ("random", "missing"),
    ]
    scores = stats.rank_methods({"mean": [S({0: 40.0}, 1)], "first": [S({0: 42.0}, 1)]}, ["cnn"],
                                lower_is_better=False)  # fmt: skip
    assert [m for m, _, _ in scores["cnn"]] == ["first", "mean"]  # higher first


def test_the_fig4_section_prints_the_ranking(tmp_path):
    sweep, values = fig4_sweep()
    md = report.write_report(sweep, fake_root(tmp_path, sweep, values))["report.md"].read_text()
    assert "Ranked per column, highest first. Against mean pooling" in md
    assert "| rank | CNN R1 | against mean | TriviaQA F1 | against mean | mean | against mean |" in md
    first = "| 1 | mean 44.50 ± 0.71, n=2 | baseline | mean 80.00 | baseline | mean 62.25, n=1 of 2 |"
    assert first + " baseline |" in md
    assert "| 2 | first 42.50 ± 0.71, n=2 | worse, beyond the spread | first 78.00 | worse (one seed" in md


@pytest.mark.parametrize("name,file", [("eval_MHA_s0", "results.json"), ("time_MHA", "timing.json")])
def test_a_done_run_whose_output_is_gone_or_unreadable_is_named(name, file, tmp_path):
    runs = (Run("eval_MHA_s0", "evaluate", {}, (), {"model": "MHA", "task": "docsum", "seed": 0}),
            Run("time_MHA", "time", {}, (), {"model": "MHA"}))  # fmt: skip
    sweep = Sweep("table1", runs, {"tasks": [["docsum", "DocSum R1", "ROUGE-1"]], "rows": {}})
    root = fake_root(tmp_path / "root", sweep, {"eval_MHA_s0": 12.0, "time_MHA": 0.02})
    (root / name / file).write_text("{trunc")
    with pytest.raises(ValueError, match=f"{root / name / file} cannot be read|{root / name / file}"):
        report.write_report(sweep, root)
    (root / name / file).unlink()
    with pytest.raises(ValueError, match=f"{root / name / file} is missing, though its run is done"):
        report.write_report(sweep, root)
