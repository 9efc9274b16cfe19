"""``data``: list tasks, prepare datasets, build the embedded suite, train a vocabulary, and look
at a task's batches.

  data tasks                                the tasks: source, lengths, metric
  data prepare TASK [--data-dir] [--manual-dir]
                                            build a task's dataset as array_record

  data build-suite [--data-dir]             the embedded stdlib suite and its vocabulary
  data train-vocab --corpus F.. --size N --out M
                                            a SentencePiece vocabulary (+100 sentinels)
  data show TASK --vocab M [--split] [--pack] [-n]
                                            decoded rows of the first batch, and its shapes

TASK is a name from ``data tasks`` or a task file, a .py file that sets ``TASK`` from the
researcher's own files (JSON Lines, JSON, CSV, TSV, Parquet) or a TFDS dataset by name
(``gqa_jax.data.user_tasks``).
"""

from __future__ import annotations

import argparse

HELP = "data: `data tasks`, `data prepare TASK`, `data build-suite`, `data train-vocab`, `data show TASK`"


def add_args(p: argparse.ArgumentParser) -> None:
    from gqa_jax.data import stdlib_suite, vocab
    from gqa_jax.data import tasks as tasks_lib

    sub = p.add_subparsers(dest="data_command", metavar="DATA_COMMAND", required=True)
    sub.add_parser("tasks", help="list the tasks", description="The tasks: source, lengths, metric.")
    prep = sub.add_parser(
        "prepare",
        help="build a task's dataset as array_record (TFDS download, MediaSum or a task file's files)",
        description="Download (where allowed) and build a task's TFDS dataset as array_record, the "
        "format the pipelines read by random access. MediaSum reads its released JSON files from "
        "--manual-dir; the stdlib_* tasks build from the local Python; a task file's files are "
        "converted, so that a split larger than memory is read record by record.",
    )
    prep.add_argument("task", help=f"one of: {', '.join(tasks_lib.TASKS)}; or a task file (my_task.py)")
    prep.add_argument("--data-dir", default=None, help="TFDS data directory (default: $GQA_JAX_DATA_DIR, "
                      "$TFDS_DATA_DIR or ~/tensorflow_datasets)")  # fmt: skip
    prep.add_argument("--manual-dir", default=None, help="MediaSum: directory with news_dialogue.json "
                      "and train_val_test_split.json")  # fmt: skip
    suite = sub.add_parser(
        "build-suite",
        help="build the embedded stdlib task suite and its vocabulary (offline, a few minutes)",
        description="Build stdlib_corpus, stdlib_docsum, stdlib_modsum and stdlib_qa from this "
        "Python's standard library, and train their vocabulary.",
    )
    stdlib_suite.add_build_suite_args(suite)
    tv = sub.add_parser(
        "train-vocab",
        help="train a SentencePiece vocabulary for a corpus that has none",
        description="Train a SentencePiece unigram model (pad 0, eos 1, unk 2; 100 sentinels added "
        "on load) from text files.",
    )
    vocab.add_train_vocab_args(tv)
    show = sub.add_parser(
        "show",
        help="decode the first batch of a task (check prefixes, lengths, packing)",
        description="Decode the first rows of a task's first batch and print the batch's shapes.",
    )
    show.add_argument("task", help=f"one of: {', '.join(tasks_lib.TASKS)}; or a task file (my_task.py)")
    show.add_argument("--vocab", default=None, help="SentencePiece model (default for stdlib_* tasks: "
                      "the suite's vocabulary)")  # fmt: skip
    show.add_argument("--split", default="validation")
    show.add_argument("--data-dir", default=None)
    show.add_argument("--pack", action="store_true", help="packed rows (training streams only)")
    show.add_argument("-n", type=int, default=2, help="rows to decode")


def _tasks_table() -> str:
    from gqa_jax.data import tasks as tasks_lib

    rows = ["| task | source | input/target tokens | metric | what |", "|---|---|---|---|---|"]
    for t in tasks_lib.TASKS.values():
        rows.append(
            f"| {t.name} | {t.source} | {t.input_length}/{t.target_length} | {t.metric or '-'} | "
            f"{t.description} |"
        )
    return "\n".join(rows)


def _show(args: argparse.Namespace) -> int:
    from gqa_jax.data import pipeline, stdlib_suite, vocab
    from gqa_jax.data import tasks as tasks_lib

    task = tasks_lib.get_task(args.task)
    data_dir = args.data_dir or tasks_lib.default_data_dir()
    if args.vocab is None:
        if not task.suite:
            raise ValueError(f"task {task.name} needs --vocab (a SentencePiece model, e.g. T5's)")
        voc = stdlib_suite.suite_vocab(data_dir)
    else:
        voc = vocab.load_vocab(args.vocab)
    p = pipeline.make_pipeline(
        task, args.split, voc, batch_size=max(args.n, 1), data_dir=data_dir, pack=args.pack,
        repeat=True if args.pack else None,
    )  # fmt: skip
    batch = next(p.iterator())
    for key, value in batch.items():
        print(f"{key}: {value.shape} {value.dtype}")
    for r in range(min(args.n, batch["encoder_input_tokens"].shape[0])):
        print(f"--- row {r}")
        print("inputs :", voc.decode(batch["encoder_input_tokens"][r])[:1000])
        print("targets:", voc.decode(batch["decoder_target_tokens"][r])[:1000])
    return 0


def run(args: argparse.Namespace) -> int:
    from gqa_jax.data import stdlib_suite, vocab
    from gqa_jax.data import tasks as tasks_lib

    cmd = args.data_command
    if cmd == "tasks":
        print(_tasks_table())
        return 0
    if cmd == "prepare":
        counts = tasks_lib.prepare(args.task, args.data_dir, manual_dir=args.manual_dir)
        print(", ".join(f"{split}: {n}" for split, n in counts.items()))
        return 0
    if cmd == "build-suite":
        return stdlib_suite.run_build_suite(args)
    if cmd == "train-vocab":
        return vocab.run_train_vocab(args)
    if cmd == "show":
        return _show(args)
    raise ValueError(f"unknown data command {cmd!r}")
