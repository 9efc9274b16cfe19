"""``plan`` on 8 simulated CPU devices (a part of tests/eight_devices.py; its test is in
tests/test_plan.py): for the tiny preset on a 2x4 mesh, K = 4 (the cache over data x model) and
K = 2 (4-way model does not divide it: rows over data only), each plan's checks, decode numbers and
report; and a batch the data axis does not divide, through the command line. Prints one JSON line."""

import contextlib
import io
import json

from gqa_jax.__main__ import main as cli
from gqa_jax.tools import plan, plan_report


def main() -> None:
    out = {}
    for mesh, k in (("2x4", 4), ("2x4", 2)):
        s = plan.PlanSettings(preset="tiny", num_kv_heads=k, mesh=mesh, batch=4, input_len=16, output_len=8,
                              programs=("decode",), batch_search=())  # fmt: skip
        res = plan.plan(s)
        out[f"{mesh}:{k}"] = {
            "checks": res["checks"],
            "decode": res["programs"]["decode"],
            "report": plan_report.report(res),
        }
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        out["bad_batch"] = cli("plan --preset tiny --mesh 2x4 --batch 3 --no-batch-search".split())
    out["bad_batch_stderr"] = err.getvalue()
    print(json.dumps(out), flush=True)
