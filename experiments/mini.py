"""The mini reproduction: the paper's pipeline, every table and figure, at a scale a laptop CPU
runs offline, on the embedded stdlib suite (``python -m gqa_jax demo`` runs it and its report).

    python -m gqa_jax demo                                  # = the two commands below, data first
    python -m gqa_jax sweep experiments/mini.py --root runs/mini --jobs 2
    python -m gqa_jax report experiments/mini.py --root runs/mini

Roles (shapes in ``SCALES``): two MHA models pre-trained from scratch with span corruption on
``stdlib_span`` stand in for T5.1.1-Large and -XXL; the XXL role is converted by mean pooling to
MQA (1 K/V head) and GQA-2 (2 groups of its 8 heads, where the paper's GQA-8-XXL has 8 groups of
64) and uptrained for alpha = 0.05 of its pre-training steps. The four Table 1 roles are
fine-tuned (2 seeds, 3 for MQA as the paper's Appendix A does) on ``stdlib_calls`` (a function's
source -> the names it calls, F1: an answer read from the input, like TriviaQA's) and
``stdlib_modsum`` (a module's source -> its docstring's first paragraph, ROUGE-1), the best dev
checkpoint is scored on the dev split (its task metric and its teacher-forced dev loss, on 256
examples: all of modsum's smaller one), each role is also scored before fine-tuning
(``eval_<role>_<task>_start``: the sanity claims' step 0), and each role's greedy decoding is
timed at the timing shape (``time``: batch 32, 256 input tokens, 256 output; every time run repeats
its timing ``time.runs`` times, the decoder's steps alone too), under our decode and under the
paper's (``time_decodes``: T5X's decode, an instrument for the paper's timings; its own report
section and time claims, apart from Table 1's).
``stdlib_docsum`` and ``stdlib_qa`` are not in the default scale: no role read its input there
at any setting tried (docsum: a constant sentence scores above every fine-tuned model; qa: each
role answers one name to nearly every question; docs/experiments.md); the ``large`` scale keeps
them beside calls and modsum, to find out whether larger roles do. The figures:

- Fig. 3 from Table 1;
- Fig. 4: the Large role -> MQA by mean / first / random, uptrained at alpha 0.05, scored on a
  proxy: the dev span-corruption loss right after the conversion and after uptraining (lower is
  better); ``--set methods=all`` adds every other method of ``gqa_jax.conversion`` and the
  calibrated variants (beyond the paper, docs/checkpoints.md), ``--set fig4_seeds=3`` three
  uptraining seeds of each;
- Fig. 5: the XXL role's MQA and GQA at alpha 0 (converted, no step), 0.05 and 0.1, on the same
  proxy, with the MHA XXL role's pre-training dev loss as the reference line;
- Fig. 6: time per sample against the number of groups (1, 2, 4, 8) at the XXL role's shape and
  the timing shape (converted weights, EOS disabled), with the float cache and (beyond the paper)
  an int8 KV cache (``--set caches=float`` for the float line alone; the quick scale's default).

Settings that differ from the paper's, and why: fine-tuning at batch 8 for 600 steps on calls
and 200 on modsum (a few epochs of its small training split), the learning rate 0.005 falling
linearly to 0 (``optimizer.schedule=linear``; the paper: a constant 0.001, batch 128, to
convergence; at a constant 0.01 the dev score jumped by points between evaluations, at 0.001
these small models barely move), no dropout (its random bits are a large share of a fine-tuning
step on a CPU), the tasks at shorter lengths than the suite's own (512 and 2048 inputs cost
seconds per step on a CPU), timing in float32 (bfloat16 is slow on a CPU) at one shape, batch 32
(the paper's rule: the largest batch that fits, up to 32 per chip; everything fits here) with 256
input and 256 output tokens, where the KV cache is most of what a decoder step reads and the
decoder's steps most of the time (at the tasks' 256 / 32 tokens and batch 8 the prefill is a large
share of it; docs/experiments.md has the pilot). Greedy decoding, the best dev checkpoint and the
conversion are the paper's.

Scales (``--set scale=...``): ``default`` (the README's main command), ``quick`` (the test
suite's: one task, few steps, a smoke run of a few minutes), ``large`` (bigger roles and longer
runs for a GPU or TPU host). How many runs each has: ``sweep experiments/mini.py --set
scale=... --dry-run``; their measured wall times: docs/experiments.md.

The paper's numbers beside ours are its Table 1 rows (T_infer s per TPUv4 chip / its Average over
its seven tasks): MHA-Large 0.37 / 46.0, MHA-XXL 1.51 / 47.2, MQA-XXL 0.24 / 46.6, GQA-8-XXL
0.28 / 47.1; another scale and other tasks, so the ordering is what compares. The report ends
with the sanity claims and then the paper's claims, each with its numbers, the smallest difference
its seeds resolve and a verdict (docs/mini/ has the measured one).
"""

from gqa_jax.data import stdlib_suite
from gqa_jax.data.locations import default_data_dir
from gqa_jax.data.tasks import get_task
from gqa_jax.experiments import paper
from gqa_jax.experiments import runs as R
from gqa_jax.experiments.sweep import Run, Sweep

# methods: Fig. 4's conversions, "paper" (mean, first, random), "all" (every method of the registry and
# its calibrated variants) or a list (paper.conversion_methods);
# fig4_seeds: uptraining seeds of each (their spread is in the report); caches: Fig. 6's KV caches
# (paper.fig6_caches; None: the scale's)
PARAMS = {"scale": "default", "data_dir": None, "vocab": None, "methods": "paper", "fig4_seeds": 1,
          "caches": None}  # fmt: skip

_L = {
    "d_model": 64,
    "d_ff": 128,
    "num_encoder_layers": 2,
    "num_decoder_layers": 2,
    "num_heads": 4,
    "head_dim": 16,
}
_XXL = {
    "d_model": 128,
    "d_ff": 256,
    "num_encoder_layers": 2,
    "num_decoder_layers": 2,
    "num_heads": 8,
    "head_dim": 16,
}
SCALES = {
    "default": {
        "vocab_size": 8000,
        "shapes": {"Large": _L, "XXL": _XXL},
        "gqa": 2,
        "pretrain": {"num_train_steps": 400, "batch_size": 16, "input_length": 128, "eval_every": 200},
        "span_eval_examples": 32,
        "alphas": (0.0, 0.05, 0.1),
        # stdlib_docsum and stdlib_qa are left out: no role read its input there (docs/experiments.md)
        "tasks": (("stdlib_calls", 256, 32), ("stdlib_modsum", 256, 32)),
        "seeds": {"MHA-Large": 2, "MHA-XXL": 2, "MQA-XXL": 3, "GQA-2-XXL": 2},
        "finetune": {
            # modsum's training split is small (one example per row at 256 tokens): 200 steps are a
            # few epochs of it
            "num_train_steps": {"stdlib_calls": 600, "stdlib_modsum": 200},
            "eval_every": {"stdlib_calls": 150, "stdlib_modsum": 50},
            "batch_size": 8,
            "learning_rate": 0.005,
            "schedule": "linear",
            "dropout_rate": 0.0,
        },
        "eval_examples": 64,
        "evaluate_examples": 256,  # more than modsum's dev split holds: all of it
        # Table 1's and Fig. 6's time runs at one shape where the cache is most of what a decoder step
        # reads and the steps most of the time (docs/experiments.md); lengths None: the tasks'
        "time": {"batch": 32, "runs": 5, "lengths": (256, 256)},
        # Table 1's time runs also under the paper's decode (T5X's: an instrument for its timings)
        "time_decodes": ("ours", "paper"),
        "groups": (1, 2, 4, 8),
        "fig6_lengths": (256, 256),
        "caches": "float,int8",
    },
    "quick": {
        "vocab_size": 1000,
        "shapes": {
            "Large": dict(_L, d_model=32, d_ff=64, num_encoder_layers=1, num_decoder_layers=1),
            "XXL": dict(_XXL, d_model=32, d_ff=64, num_encoder_layers=1, num_decoder_layers=1, head_dim=8),
        },
        "gqa": 2,
        "pretrain": {"num_train_steps": 4, "batch_size": 4, "input_length": 64, "eval_every": 4},
        "span_eval_examples": 8,
        "alphas": (0.0, 0.05),
        "tasks": (("stdlib_calls", 64, 8),),
        "seeds": {"MHA-Large": 1, "MHA-XXL": 1, "MQA-XXL": 2, "GQA-2-XXL": 2},
        "finetune": {
            "num_train_steps": 2,
            "eval_every": 2,
            "batch_size": 4,
            "learning_rate": 0.01,
            "schedule": "linear",
            "dropout_rate": 0.0,
        },
        "eval_examples": 4,
        "evaluate_examples": 4,
        # as the default: a shape where the cache is most of what a decoder step reads
        "time": {"batch": 16, "runs": 5, "lengths": (64, 64)},
        "time_decodes": ("ours",),
        "groups": (1, 8),
        "fig6_lengths": (64, 64),
        "caches": "float",
    },
    "large": {
        "vocab_size": 8000,
        "shapes": {
            "Large": {
                "d_model": 256,
                "d_ff": 1024,
                "num_encoder_layers": 4,
                "num_decoder_layers": 4,
                "num_heads": 8,
                "head_dim": 32,
            },
            "XXL": {
                "d_model": 512,
                "d_ff": 2048,
                "num_encoder_layers": 8,
                "num_decoder_layers": 8,
                "num_heads": 16,
                "head_dim": 32,
            },
        },
        "gqa": 4,
        "pretrain": {"num_train_steps": 20_000, "batch_size": 64, "input_length": 512, "eval_every": 1000},
        "span_eval_examples": 256,
        "alphas": (0.0, 0.05, 0.1),
        # calls and modsum as in the default scale, at the suite's lengths; docsum and qa too, which
        # no role of the default scale learned (whether larger roles do is not measured)
        "tasks": (
            ("stdlib_calls", 256, 32),
            ("stdlib_modsum", 2048, 128),
            ("stdlib_docsum", 512, 64),
            ("stdlib_qa", 2048, 16),
        ),
        "seeds": {"MHA-Large": 2, "MHA-XXL": 2, "MQA-XXL": 3, "GQA-4-XXL": 2},
        "finetune": {"num_train_steps": 3000, "eval_every": 500, "batch_size": 32, "learning_rate": 0.001},
        "eval_examples": 512,
        "evaluate_examples": None,
        "time": {"batch": "auto", "runs": 5, "lengths": None},  # the tasks' lengths
        "time_decodes": ("ours", "paper"),
        "groups": (1, 2, 4, 8, 16),
        "fig6_lengths": (2048, 512),
        "caches": "float,int8",
    },
}
PROXY = "dev span-corruption loss"


def _per_task(value, task):
    """A setting that is one value for every task, or a dict of them by task."""
    return value[task] if isinstance(value, dict) else value


def _roles(s):
    """Table 1's roles: name -> (the run whose model/ it starts from, that run's name as a dep)."""
    gqa = f"GQA-{s['gqa']}-XXL"
    return {
        "MHA-Large": "pretrain_large",
        "MHA-XXL": "pretrain_xxl",
        "MQA-XXL": "uptrain_xxl_k1_a0.05",
        gqa: f"uptrain_xxl_k{s['gqa']}_a0.05",
    }


def _vocab(s, params):
    """The runs' vocabulary: the one given, else the suite's of the scale's size (the file the demo
    builds; a run builds it where it is missing); None for the suite's default size, which every
    stdlib run loads without one."""
    if params["vocab"] is not None or s["vocab_size"] == stdlib_suite.VOCAB_SIZE:
        return params["vocab"]
    return str(stdlib_suite.suite_vocab_path(params["data_dir"] or default_data_dir(), s["vocab_size"]))


def get_sweep(params):
    if params["scale"] not in SCALES:
        raise ValueError(f"unknown scale {params['scale']!r}; choose from {', '.join(SCALES)}")
    s = SCALES[params["scale"]]
    assert 0.05 in s["alphas"], "Table 1's roles start from the alpha 0.05 uptraining"
    if int(params["fig4_seeds"]) < 1:
        raise ValueError(f"fig4_seeds={params['fig4_seeds']} leaves Fig. 4 without a run: give 1 or more")
    params = {**params, "vocab": _vocab(s, params)}  # the runs' and the evaluations' vocabulary
    data = {"data_dir": params["data_dir"], "vocab": params["vocab"], "progress": False, "log_every": 10}
    span = dict(
        data,
        task="stdlib_span",
        eval_examples=s["span_eval_examples"],
        input_length=s["pretrain"]["input_length"],
        batch_size=s["pretrain"]["batch_size"],
    )
    runs = [
        *_pretrain_runs(s, span),
        *_fig5_uptrain_runs(s, params, span),
        *_fig4_uptrain_runs(s, params, span),
        *_table1_finetune_runs(s, params, data),
        *_fig6_convert_runs(s),
    ]
    # Time runs last: each runs alone (the runner never starts anything beside a time run).
    timing = {"batch": s["time"]["batch"], "runs": s["time"]["runs"], "dtype": "float32"}
    caches = paper.fig6_caches(params["caches"] or s["caches"])
    runs += [*_table1_time_runs(s, timing), *_fig6_time_runs(s, timing, caches)]
    return Sweep("mini", tuple(runs), _paper(s, paper.conversion_methods(params["methods"]), caches))


def _model(role):
    """The model a pre-trained role leaves: ``{run:pretrain_<role>}/model``."""
    return f"{{run:pretrain_{role.lower()}}}/model"


def _pretrain_runs(s, span):
    """Each role (``Large``, ``XXL``) pre-trained from scratch as an MHA model."""
    steps = s["pretrain"]["num_train_steps"]
    runs = []
    for role, shape in s["shapes"].items():
        fields = dict(
            span,
            num_train_steps=steps,
            eval_every=s["pretrain"]["eval_every"],
            checkpoint_every=max(1, steps // 4),
            **{f"model.{k}": v for k, v in shape.items()},
        )
        runs.append(
            Run(
                f"pretrain_{role.lower()}",
                "pretrain",
                dict(fields, config=paper.config("pretrain")),
                tags={"model": f"MHA-{role}"},
            )
        )
    return runs


def _uptrain(s, params, span, name, role, kv, alpha, method="mean", tags=None, seed=0, at_start=False):
    """``role`` converted to ``kv`` K/V heads by ``method`` and uptrained for ``alpha`` of its
    pre-training steps (scored before the first step too at alpha 0 or with ``at_start``)."""
    alpha_fields = {"eval_at_start": True} if alpha == 0 or at_start else {}
    return R.uptrain(
        name,
        _model(role),
        kv,
        params,
        method=method,
        alpha=alpha,
        original_steps=s["pretrain"]["num_train_steps"],
        deps=(f"pretrain_{role.lower()}",),
        seed=seed,
        tags=tags,
        **{**span, "eval_every": 0, "checkpoint_every": 1000, **alpha_fields},
    )


def _fig5_uptrain_runs(s, params, span):
    """Fig. 5 (and Table 1's starting points at alpha 0.05): the XXL role at each alpha."""
    runs = []
    for kv, model in ((1, "MQA-XXL"), (s["gqa"], f"GQA-{s['gqa']}-XXL")):
        for alpha in s["alphas"]:
            name, tags = f"uptrain_xxl_k{kv}_a{alpha:g}", {"model": model, "alpha": alpha}
            runs.append(_uptrain(s, params, span, name, "XXL", kv, alpha, tags=tags))
    return runs


def _fig4_uptrain_runs(s, params, span):
    """Fig. 4: the Large role -> MQA by each method, alpha 0.05, scored converted (step 0) and
    uptrained, over fig4_seeds uptraining seeds (seed 0's run keeps its name)."""
    runs = []
    for method in paper.conversion_methods(params["methods"]):
        for seed in range(int(params["fig4_seeds"])):
            name = f"uptrain_large_mqa_{method}" + (f"_s{seed}" if seed else "")
            tags = {"method": method, "seed": seed}
            runs.append(
                _uptrain(s, params, span, name, "Large", 1, 0.05, method, tags, seed=seed, at_start=True)
            )
    return runs


def _finetune_fields(s, data, task, lengths):
    """The fine-tuning run's config fields on ``task`` at ``lengths``."""
    ft = s["finetune"]
    return dict(
        data,
        **lengths,
        num_train_steps=_per_task(ft["num_train_steps"], task),
        eval_every=_per_task(ft["eval_every"], task),
        batch_size=ft["batch_size"],
        eval_examples=s["eval_examples"],
        eval_at_start=False,
        checkpoint_every=1000,
        **{"optimizer.learning_rate": ft["learning_rate"]},
        **({"optimizer.schedule": ft["schedule"]} if "schedule" in ft else {}),
        **({"model.dropout_rate": ft["dropout_rate"]} if "dropout_rate" in ft else {}),
    )


def _table1_finetune_runs(s, params, data):
    """Table 1: every role fine-tuned on every task and its best dev checkpoint scored, each seed;
    and the role before fine-tuning scored the same way (the sanity claims' step 0)."""
    runs = []
    for model, start in _roles(s).items():
        key = model.lower().replace("-", "_")
        for task, inp, tgt in s["tasks"]:
            lengths = {"input_length": inp, "target_length": tgt}
            runs.append(
                R.evaluate(
                    f"eval_{key}_{task}_start",
                    f"{{run:{start}}}/model",
                    task,
                    params,
                    deps=(start,),
                    tags={"model": model, "task": task, "start": True},
                    **lengths,
                    examples=s["evaluate_examples"],
                )
            )
            for seed in range(s["seeds"][model]):
                runs += R.finetune_and_evaluate(
                    key,
                    f"{{run:{start}}}/model",
                    task,
                    params,
                    seed=seed,
                    deps=(start,),
                    tags={"model": model},
                    finetune_fields=_finetune_fields(s, data, task, lengths),
                    evaluate_options=dict(lengths, examples=s["evaluate_examples"]),
                )
    return runs


def _fig6_convert_runs(s):
    """Fig. 6's models: the XXL role converted to each number of groups (no uptraining)."""
    heads = s["shapes"]["XXL"]["num_heads"]
    return [
        R.convert(f"convert_xxl_k{k}", _model("XXL"), k, deps=("pretrain_xxl",))
        for k in s["groups"]
        if k != heads
    ]


def _table1_time_runs(s, timing):
    """Table 1's time per sample of each role at the timing shape, or (lengths None) at each
    task's lengths, each set of lengths once, under each of the scale's decodes (ours, and the
    paper's: ``time_<role>_<in>_<out>_decode-paper``, its report section apart from Table 1)."""
    shapes = [s["time"]["lengths"]] if s["time"]["lengths"] else [(inp, tgt) for _, inp, tgt in s["tasks"]]
    runs = []
    for decode in s["time_decodes"]:
        for model, start in _roles(s).items():
            key = model.lower().replace("-", "_")
            for inp, tgt in dict.fromkeys(shapes):
                tags = {"model": model, "lengths": f"{inp}/{tgt}"}
                runs.append(
                    R.time(
                        f"time_{key}_{inp}_{tgt}",
                        None,
                        None,
                        inp,
                        tgt,
                        model=f"{{run:{start}}}/model",
                        deps=(start,),
                        tags=tags,
                        decode=decode,
                        **timing,
                    )
                )
    return runs


def _fig6_time_runs(s, timing, caches):
    """Fig. 6: the XXL role's time per sample at each number of groups, with each KV cache."""
    heads = s["shapes"]["XXL"]["num_heads"]
    long_in, long_out = s["fig6_lengths"]
    runs = []
    for cache in caches:
        suffix, options, cache_tags = paper.fig6_cache_run(cache)
        for k in s["groups"]:
            start = "pretrain_xxl" if k == heads else f"convert_xxl_k{k}"
            runs.append(
                R.time(
                    f"time_xxl_groups_{k}{suffix}",
                    None,
                    None,
                    long_in,
                    long_out,
                    model=f"{{run:{start}}}/model",
                    deps=(start,),
                    tags={"groups": k, **cache_tags},
                    **timing,
                    **options,
                )
            )
    return runs


def _paper(s, methods=paper.FIG4_METHODS, caches=("float",)):
    """The report's schema: the paper's Table 1 rows beside our roles, the figures' axes."""
    gqa = f"GQA-{s['gqa']}-XXL"
    ours = {"MHA-Large": "MHA-Large", "MHA-XXL": "MHA-XXL", "MQA-XXL": "MQA-XXL", gqa: "GQA-8-XXL"}
    rows = {
        m: {"time": paper.TABLE1[p]["time"], "average": paper.TABLE1[p]["average"], "name": p}
        for m, p in ours.items()
    }
    labels = {
        "stdlib_calls": "calls F1",
        "stdlib_docsum": "docsum R1",
        "stdlib_modsum": "modsum R1",
        "stdlib_qa": "qa F1",
    }
    metrics = {
        "stdlib_calls": "F1",
        "stdlib_docsum": "ROUGE-1",
        "stdlib_modsum": "ROUGE-1",
        "stdlib_qa": "F1",
    }
    tasks = [[t, labels[t], metrics[t]] for t, *_ in s["tasks"]]
    note = (
        f"The paper's numbers in parentheses are its Table 1 rows (T_infer per TPUv4 chip, its Average "
        f"over its seven tasks) for the role each of ours stands for ({gqa}: its GQA-8-XXL); another "
        "scale and other tasks, so compare the ordering, not the values."
    )
    heads = s["shapes"]["XXL"]["num_heads"]
    long_in, long_out = s["fig6_lengths"]
    return {
        "table1": {"tasks": tasks, "rows": rows, "note": note},
        "fig4": {"methods": list(methods), "claim": "Mean > First > Random"},
        "fig5": {"alphas": list(s["alphas"]), "models": ["MQA-XXL", gqa], "reference": "MHA-XXL"},
        "fig6": {
            "groups": list(s["groups"]),
            "reference_groups": heads,
            "input_len": long_in,
            "output_len": long_out,
            "caches": list(caches),
        },
        "proxy": {"fig4": PROXY, "fig5": PROXY},
    }


def suite_needs(params):
    """What ``demo`` builds before the sweep: the suite's datasets (the tasks' sources) and the
    vocabulary size."""
    s = SCALES[params["scale"]]
    sources = dict.fromkeys(get_task(t).source for t, *_ in s["tasks"])
    return ("stdlib_corpus", *sources), s["vocab_size"]
