"""scripts/launch_tpu.sh: the gcloud command it would run on every TPU VM worker (--dry-run)."""

import shlex
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "launch_tpu.sh"


def run(*args):
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=60)


def test_dry_run_prints_the_all_workers_command():
    command = ["python", "-m", "gqa_jax", "train", "--workdir", "gs://b/run x", "--config.mesh=2x8"]
    out = run("--dry-run", "--tpu", "pod", "--zone", "us-central2-b", "--project", "proj", "--", *command)
    assert out.returncode == 0, out.stderr
    words = shlex.split(out.stdout)
    assert words[:6] == ["gcloud", "compute", "tpus", "tpu-vm", "ssh", "pod"]
    assert "--worker=all" in words and words[words.index("--zone") + 1] == "us-central2-b"
    assert words[words.index("--project") + 1] == "proj"
    remote = shlex.split(words[words.index("--command") + 1])
    assert remote[:6] == ["cd", "~/gqa_jax", "&&", "export", "GQA_JAX_DISTRIBUTED=auto", "&&"]
    assert remote[6:] == [
        "python",
        "-m",
        "gqa_jax",
        "train",
        "--workdir",
        "gs://b/run x",
        "--config.mesh=2x8",
    ]


def test_bad_arguments_are_one_line_errors():
    for args, message in (
        (("--zone", "z", "--", "ls"), "--tpu NAME is required"),
        (("--tpu", "p", "--", "ls"), "--zone ZONE is required"),
        (("--tpu", "p", "--zone", "z"), "no command given"),
        (("--tpu", "p", "--zone", "z", "--bogus"), "unknown argument '--bogus'"),
    ):
        out = run("--dry-run", *args)
        assert out.returncode == 2 and message in out.stderr, (args, out.stderr)
