"""The paper's sweeps as data: their dry-run commands carry the paper's settings (sizes, K, alpha,
lengths, learning rate, batch, dropout, greedy, best-dev selection), and bad sweep input errors."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from gqa_jax.data import tasks
from gqa_jax.experiments import paper, runner
from gqa_jax.experiments.sweep import load_module, load_sweep

REPO = Path(__file__).resolve().parents[1]
ROOT = Path("/tmp/sweep-root")


def dry_run(name: str, *sets: str) -> list[list[str]]:
    """The printed commands of ``--dry-run`` (split back into argv)."""
    lines: list[str] = []
    sweep = load_sweep(REPO / "experiments" / f"{name}.py", sets)
    assert runner.run_sweep(sweep, ROOT, dry_run=True, out=lines.append) == 0
    return [shlex.split(line) for line in lines]


def options(argv: list[str]) -> dict[str, str]:
    """``--config.k=v`` and ``--k v`` options of one command, by name."""
    out, i = {}, 0
    while i < len(argv):
        a = argv[i]
        if a.startswith("--config."):
            k, _, v = a[2:].partition("=")
            out[k] = v
        elif a.startswith("--") and i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            out[a[2:]] = argv[i + 1]
            i += 1
        elif a.startswith("--"):
            out[a[2:]] = "true"
        i += 1
    return out


def variant(argv: list[str]) -> dict[str, str]:
    spec = argv[argv.index("--config") + 1].partition(".py:")[2]
    return dict(item.split("=", 1) for item in spec.split(","))


def by_stage(commands: list[list[str]]) -> dict[str, list[list[str]]]:
    out: dict[str, list[list[str]]] = {}
    for argv in commands:
        assert argv[1:3] == ["-m", "gqa_jax"], argv
        stage = argv[3]
        if stage == "train":
            stage = Path(argv[argv.index("--config") + 1].partition(":")[0]).stem
        out.setdefault(stage, []).append(argv)
    return out


def check_finetune(argv: list[str]) -> None:
    """The paper's fine-tuning: constant lr 0.001, batch 128, dropout 0.1, the task's lengths."""
    o = options(argv)
    assert o["config.optimizer.learning_rate"] == "0.001"
    assert o["config.batch_size"] == "128"
    assert o["config.model.dropout_rate"] == "0.1"
    assert "config.input_length" not in o and "config.target_length" not in o  # the task's lengths
    assert int(o["config.eval_every"]) > 0  # scored on dev during training: the best one is kept


def check_evaluate(argv: list[str], finetunes: set[str]) -> None:
    """Greedy decoding (no sampling option exists) of the fine-tune's best dev checkpoint, dev split."""
    o = options(argv)
    assert o["split"] == "validation"
    model = Path(o["model"])
    assert model.name == "best_model" and str(model.parent) in finetunes


def test_table1_dry_run_has_the_papers_settings():
    commands = by_stage(dry_run("table1", "t5_large=/ck/large", "t5_xxl=/ck/xxl"))
    ups = {variant(a)["kv"]: a for a in commands["uptrain"]}
    assert set(ups) == {"1", "8"}  # MQA-XXL and GQA-8-XXL
    for argv in ups.values():
        v = variant(argv)
        assert v["source"] == "/ck/xxl" and v["method"] == "mean"
        assert float(v["alpha"]) == 0.05 and int(v["original_steps"]) == paper.T5_1_1_PRETRAIN_STEPS
        assert options(argv)["config.task"] == "c4_span"  # span corruption on C4
    fts = commands["finetune"]
    assert len(fts) == 4 * 7  # four models x seven tasks
    inits = {variant(a)["init"] for a in fts}
    assert inits == {
        "/ck/large",
        "/ck/xxl",
        f"{ROOT}/uptrain_mqa_xxl/model",
        f"{ROOT}/uptrain_gqa8_xxl/model",
    }
    assert {variant(a)["task"] for a in fts} == {t for t, *_ in paper.TABLE1_TASKS}
    for argv in fts:
        check_finetune(argv)
    workdirs = {a[a.index("--workdir") + 1] for a in fts}
    assert len(commands["evaluate"]) == 28
    for argv in commands["evaluate"]:
        check_evaluate(argv, workdirs)
    lengths = {
        (t.input_length, t.target_length) for t in map(tasks.get_task, [t for t, *_ in paper.TABLE1_TASKS])
    }
    assert lengths == {(512, 256), (2048, 512), (2048, 32)}
    times = {(options(a)["preset"], options(a)["num-kv-heads"], int(options(a)["input-len"]),
              int(options(a)["output-len"])) for a in commands["time"]}  # fmt: skip
    expected = {(p, k, s, t) for p, k in (("large", "16"), ("xxl", "64"), ("xxl", "1"), ("xxl", "8"))
                for s, t in lengths}  # fmt: skip
    assert times == expected
    assert all(options(a)["batch"] == "auto" for a in commands["time"])  # largest that fits, <= 32/device


def test_fig4_dry_run_converts_large_to_mqa_by_each_method():
    commands = by_stage(dry_run("fig4_conversion", "t5_large=/ck/large"))
    methods = {variant(a)["method"]: variant(a) for a in commands["uptrain"]}
    assert set(methods) == {"mean", "first", "random"}
    assert all(
        v["kv"] == "1" and float(v["alpha"]) == 0.05 and v["source"] == "/ck/large" for v in methods.values()
    )
    assert {variant(a)["task"] for a in commands["finetune"]} == {"cnn_dailymail", "multi_news", "trivia_qa"}
    for argv in commands["finetune"]:
        check_finetune(argv)
    workdirs = {a[a.index("--workdir") + 1] for a in commands["finetune"]}
    for argv in commands["evaluate"]:
        check_evaluate(argv, workdirs)


def test_fig4_and_the_mini_take_the_methods_beyond_the_paper():
    beyond = ("grouped", "aligned", "svd")
    for name in ("fig4_conversion", "mini"):
        first = "t5_large=/ck/large" if name == "fig4_conversion" else "scale=quick"
        commands = by_stage(dry_run(name, first, "methods=all"))
        methods = {variant(a)["method"] for a in commands["uptrain"] if "method" in variant(a)}
        assert set(beyond) <= methods and {"mean", "first", "random"} <= methods, (name, methods)
    assert load_sweep(REPO / "experiments" / "mini.py", ["methods=mean,svd"]).paper["fig4"]["methods"] == [
        "mean", "svd"]  # fmt: skip
    uptrains = by_stage(dry_run("mini", "scale=quick", "methods=mean,svd", "fig4_seeds=3"))["uptrain"]
    fig4 = [a for a in uptrains if Path(options(a)["workdir"]).name.startswith("uptrain_large_mqa_")]
    assert sorted((variant(a)["method"], options(a)["config.seed"]) for a in fig4) == [
        (m, str(s)) for m in ("mean", "svd") for s in range(3)]  # fmt: skip
    assert all(options(a)["config.eval_at_start"] == "True" for a in fig4)  # the converted model's loss
    with pytest.raises(ValueError, match="methods='median': name 'paper', 'all' or some of mean"):
        load_sweep(REPO / "experiments" / "fig4_conversion.py", ["methods=median"])


def test_a_calibrated_method_uptrains_that_method_with_calibration_batches():
    uptrains = by_stage(dry_run("mini", "scale=quick", "methods=svd,svd-calibrated,grouped-calibrated"))[
        "uptrain"
    ]
    fig4 = {Path(options(a)["workdir"]).name: variant(a) for a in uptrains
            if Path(options(a)["workdir"]).name.startswith("uptrain_large_mqa_")}  # fmt: skip
    assert (
        fig4["uptrain_large_mqa_svd"]["method"] == "svd"
        and "calibration" not in fig4["uptrain_large_mqa_svd"]
    )
    calibrated = fig4["uptrain_large_mqa_svd-calibrated"]
    assert (calibrated["method"], calibrated["calibration"]) == ("svd", str(paper.CALIBRATION_BATCHES))
    assert fig4["uptrain_large_mqa_grouped-calibrated"]["method"] == "grouped"
    assert {"svd-calibrated", "grouped-calibrated"} <= set(paper.conversion_methods("all"))


def test_fig5_dry_run_covers_alpha_0_005_01_for_mqa_and_gqa8_and_the_mha_reference():
    commands = by_stage(dry_run("fig5_alpha", "t5_xxl=/ck/xxl"))
    converted = {options(a)["num-kv-heads"] for a in commands["convert"]}  # alpha 0: converted only
    assert converted == {"1", "8"}
    assert all(options(a)["method"] == "mean" and options(a)["src"] == "/ck/xxl" for a in commands["convert"])
    uptrained = {(variant(a)["kv"], float(variant(a)["alpha"])) for a in commands["uptrain"]}
    assert uptrained == {("1", 0.05), ("1", 0.1), ("8", 0.05), ("8", 0.1)}
    inits = {variant(a)["init"] for a in commands["finetune"]}
    assert "/ck/xxl" in inits and len(inits) == 1 + 6  # MHA reference + 2 models x 3 alphas
    for argv in commands["finetune"]:
        check_finetune(argv)


def test_fig6_dry_run_times_xxl_at_each_group_count_with_the_float_and_the_int8_cache():
    commands = by_stage(dry_run("fig6_groups"))
    by_cache = {}
    for argv in commands["time"]:
        o = options(argv)
        assert (o["preset"], o["input-len"], o["output-len"]) == ("xxl", "2048", "512")
        by_cache.setdefault(o.get("cache-dtype", "float"), []).append(int(o["num-kv-heads"]))
    assert by_cache == {"float": [1, 4, 8, 16, 32, 64], "int8": [1, 4, 8, 16, 32, 64]}
    only_float = by_stage(dry_run("fig6_groups", "caches=float"))["time"]
    assert len(only_float) == 6 and not any("--cache-dtype" in a for a in only_float)
    fp8 = by_stage(dry_run("fig6_groups", "caches=float8_e4m3fn"))["time"]
    assert {options(a)["cache-dtype"] for a in fp8} == {"float8_e4m3fn"}
    with pytest.raises(ValueError, match="caches='int4': name some of float, int8"):
        load_sweep(REPO / "experiments" / "fig6_groups.py", ["caches=int4"])


def test_the_sweeps_quantized_caches_are_the_kv_caches():
    from gqa_jax import kv_quant

    assert set(paper.QUANTIZED_CACHES) == set(kv_quant.QMAX)


def test_set_changes_a_param_or_a_field_and_unknown_keys_are_errors():
    commands = by_stage(dry_run("fig6_groups", "batch=8"))
    assert {options(a)["batch"] for a in commands["time"]} == {"8"}
    commands = by_stage(dry_run("table1", "batch_size=64"))  # a field of every train run that has it
    assert {options(a)["config.batch_size"] for a in commands["finetune"]} == {"64"}
    with pytest.raises(ValueError, match="no run of sweep fig6_groups has a field 'nonsense'.*known keys"):
        load_sweep(REPO / "experiments" / "fig6_groups.py", ["nonsense=1"])
    with pytest.raises(ValueError, match="must look like key=value"):
        load_sweep(REPO / "experiments" / "fig6_groups.py", ["batch"])


def test_bad_sweep_files_are_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_sweep(tmp_path / "missing.py")
    (tmp_path / "empty.py").write_text("x = 1\n")
    with pytest.raises(ValueError, match="defines no PARAMS"):
        load_sweep(tmp_path / "empty.py")
    (tmp_path / "bad.py").write_text(
        "from gqa_jax.experiments.sweep import Run, Sweep\nPARAMS = {}\n"
        "def get_sweep(params):\n"
        "    return Sweep('bad', (Run('a', 'pretrain', {'config': 'c.py'}), Run('b', 'finetune',"
        " {'config': 'c.py', 'init_from': '{run:a}/model'}), Run('c', 'bake', {}, ('zzz',))))\n"
    )
    with pytest.raises(ValueError) as e:
        load_sweep(tmp_path / "bad.py")
    message = str(e.value)
    assert "refers to {run:a} without listing 'a' in deps" in message
    assert "unknown stage 'bake'" in message and "dependency 'zzz' is not a run listed before it" in message
    with pytest.raises(ValueError, match="--only 'nothing\\*' matches no run"):
        runner.run_sweep(
            load_sweep(REPO / "experiments" / "fig6_groups.py"), ROOT, only="nothing*", dry_run=True
        )


@pytest.mark.parametrize(
    "scale, runs, paper_decode", [("default", 74, 4), ("quick", 32, 0), ("large", 145, 16)]
)
def test_every_mini_scale_loads_with_every_stage_and_the_four_roles(scale, runs, paper_decode):
    sweep = load_sweep(REPO / "experiments" / "mini.py", [f"scale={scale}"])
    assert len(sweep.runs) == runs
    decoded = [r for r in sweep.runs if r.tags.get("decode") == "paper"]  # Table 1's time runs, T5X's decode
    assert len(decoded) == paper_decode and all(
        r.args["decode"] == "paper" and "model" in r.tags for r in decoded
    )
    starts = {(r.tags["model"], r.tags["task"]) for r in sweep.runs if r.tags.get("start")}
    finetuned = {(r.tags["model"], r.tags["task"]) for r in sweep.runs if r.stage == "finetune"}
    assert starts == finetuned  # every fine-tuned cell has its step-0 score (the sanity claims')
    mini = load_module(REPO / "experiments" / "mini.py")
    built, _ = mini.suite_needs({**mini.PARAMS, "scale": scale})  # demo builds the tasks' datasets
    assert set(built) == {"stdlib_corpus", *(tasks.get_task(t).source for _, t in finetuned)}
    assert all(r.args["runs"] >= 5 for r in sweep.runs if r.stage == "time")  # timings with spread
    if scale != "large":  # the CPU scales' fine-tuning: the rate decays to 0, no dropout
        finetunes = [r.args for r in sweep.runs if r.stage == "finetune"]
        assert all(a["optimizer.schedule"] == "linear" and a["model.dropout_rate"] == 0.0 for a in finetunes)
    assert {r.stage for r in sweep.runs} == {"pretrain", "convert", "uptrain", "finetune", "evaluate", "time"}
    models = {r.tags["model"] for r in sweep.runs if r.stage == "evaluate"}
    assert models == {"MHA-Large", "MHA-XXL", "MQA-XXL", *sweep.paper["fig5"]["models"][1:]}
    seeds = {
        m: {r.tags["seed"] for r in sweep.runs if r.stage == "finetune" and r.tags["model"] == m}
        for m in models
    }
    assert len(seeds["MQA-XXL"]) >= 2 and all(
        len(s) >= (1 if scale == "quick" else 2) for s in seeds.values()
    )
    with pytest.raises(ValueError, match="unknown scale 'huge'; choose from default, quick, large"):
        load_sweep(REPO / "experiments" / "mini.py", ["scale=huge"])
