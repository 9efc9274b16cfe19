"""Noise kept off the terminal on the way to work: libtpu's native warnings (kept where stderr is
a log file) and TFDS's lines while the stdlib suite builds."""

import os

from gqa_jax.data import stdlib_extract, stdlib_suite
from gqa_jax.log import native_noise_off_the_terminal


def test_native_writes_to_fd2_are_kept_off_a_terminal_and_passed_to_a_log(capfd, monkeypatch):
    monkeypatch.delenv("GQA_JAX_DEBUG", raising=False)
    monkeypatch.setattr(os, "isatty", lambda fd: True)
    with native_noise_off_the_terminal():
        os.write(2, b"E0000 TPU_WORKER_HOSTNAMES\n")
    assert capfd.readouterr().err == ""
    monkeypatch.setattr(os, "isatty", lambda fd: False)  # stderr is a run's log file
    with native_noise_off_the_terminal():
        os.write(2, b"E0000 TPU_WORKER_HOSTNAMES\n")
    assert capfd.readouterr().err == "E0000 TPU_WORKER_HOSTNAMES\n"


def test_the_suite_builds_without_tfds_lines(tmp_path, capfd, monkeypatch):
    monkeypatch.setenv(stdlib_extract.MAX_FILES_ENV, "4")
    counts = stdlib_suite.build_suite(tmp_path, names=("stdlib_docsum",))
    out = capfd.readouterr()
    assert counts["stdlib_docsum"]["train"] > 0
    assert "Downloading and preparing" not in out.out + out.err and "Dataset stdlib_docsum" not in out.out
    assert out.out.startswith("stdlib_docsum: building")
