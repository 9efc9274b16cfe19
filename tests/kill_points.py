"""``python tests/kill_points.py POINT STEP -- <gqa_jax arguments>``: run the command line in a
process that SIGKILLs itself at one chosen point, as a power cut or an OOM killer would.

``python tests/kill_points.py serve``: the same for each request on stdin, one JSON object a line
(``{"point", "step", "argv", "stderr": PATH}``), in a child forked from this process (its imports
paid once, not per run; no JAX backend has started here), its stderr written to ``PATH``; the
answer on stdout is ``{"rc": ...}`` (``-9``: the kill came). tests/test_resume.py starts one.

POINT is one of
  save-start  when checkpoint STEP is about to be written (nothing of it on disk yet)
  save-commit when every file of checkpoint STEP is written, before orbax renames it into place
  export      when the final model/ is complete in its temporary directory, before its rename
"""

import gc
import json
import os
import signal
import sys

gc.disable()  # its imports' objects live as long as it does: frozen below, never walked (tests/conftest.py)

import orbax.checkpoint as ocp  # noqa: E402
from orbax.checkpoint._src.path import atomicity  # noqa: E402

from gqa_jax import __main__ as cli  # noqa: E402

gc.freeze()
gc.enable()


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def arm(point: str, step: int) -> None:
    """Make this process SIGKILL itself at ``point`` (checkpoint ``step``'s, for the saves)."""
    if point == "save-start":
        save = ocp.CheckpointManager.save

        def save_or_die(self, at, *args, **kwargs):
            if at == step:
                die()
            return save(self, at, *args, **kwargs)

        ocp.CheckpointManager.save = save_or_die
    elif point == "save-commit":
        finalize = atomicity.AtomicRenameTemporaryPath.finalize

        async def finalize_or_die(self):
            if self._final_path.name == str(step):
                die()
            return await finalize(self)

        atomicity.AtomicRenameTemporaryPath.finalize = finalize_or_die
    elif point == "export":
        replace = os.replace

        def replace_or_die(src, dst, *args, **kwargs):  # the rename of model.tmp-* to model
            if os.path.basename(os.fspath(dst)) == "model" and ".tmp-" in os.fspath(src):
                die()
            return replace(src, dst, *args, **kwargs)

        os.replace = replace_or_die
    else:
        raise SystemExit(f"unknown kill point {point}")


def serve() -> None:
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:  # the run: stdout dropped, stderr to its file, killed at its point
            with open(request["stderr"], "wb") as err, open(os.devnull, "wb") as out:
                os.dup2(out.fileno(), 1)
                os.dup2(err.fileno(), 2)
            code = 1
            try:
                arm(request["point"], request["step"])
                code = cli.main(request["argv"])
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        status = os.waitpid(pid, 0)[1]
        print(json.dumps({"rc": os.waitstatus_to_exitcode(status)}), flush=True)


if __name__ == "__main__":
    if sys.argv[1:] == ["serve"]:
        serve()
    else:
        point, step, sep, *argv = sys.argv[1:]
        assert sep == "--", "usage: kill_points.py POINT STEP -- <gqa_jax arguments>"
        arm(point, int(step))
        sys.exit(cli.main(argv))
