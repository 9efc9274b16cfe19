"""``plan``'s search for the largest batch that fits: per device, memory is affine in the batch
(params and optimizer state fixed; activations, gradients' batch-shaped parts and the cache grow
with the rows), so a line through two compiled totals predicts it, and compiles either side of
the limit verify it (module ``plan``'s docstring)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gqa_jax.tools.compiled_memory import GIB

MAX_REFITS = 2


def fit(points: dict[int, int], a: int, b: int) -> tuple[float, float]:
    """The line ``total = fixed + per_row * batch`` through the compiled totals at ``a`` and ``b``."""
    per_row = (points[b] - points[a]) / (b - a)
    return points[a] - per_row * a, per_row


def predict(fixed: float, per_row: float, limit: float, step: int) -> int:
    """The largest multiple of ``step`` whose predicted total is within ``limit`` (0: none)."""
    if per_row <= 0:
        raise ValueError(f"memory does not grow with the batch (per row {per_row:.0f} bytes): cannot search")
    return max(0, int((limit - fixed) // per_row) // step * step)


def search_batch(
    measure: Callable[[int], int], batch: int, step: int, limit: int, log: Callable[[str], None]
) -> dict[str, Any]:
    """The largest multiple of ``step`` whose compiled total (``measure(batch)``) is <= ``limit``.

    Fit the line through the totals at ``batch`` and at the smallest batch ``step`` (twice it when
    ``batch`` is the smallest): when nothing larger fits, that compile is also the verification.
    Predict, then verify by measuring the prediction and the next multiple. When they disagree
    with the prediction, refit between the measured batches either side of the limit (at most
    ``MAX_REFITS`` times)."""
    points: dict[int, int] = {}

    def at(b: int) -> int:
        if b not in points:
            points[b] = measure(b)
        return points[b]

    second = step if batch > step else 2 * step
    at(batch), at(second)
    fixed, per_row = fit(points, min(batch, second), max(batch, second))
    fit_points = sorted((batch, second))
    how = [f"line through the compiled totals at batch {fit_points[0]} and {fit_points[1]}"]
    best = None
    for round_ in range(MAX_REFITS + 1):
        guess = predict(fixed, per_row, limit, step)
        log(
            f"  predicted largest batch {guess} (fixed {fixed / GIB:.2f} GiB + "
            f"{per_row / 2**20:.2f} MiB per row)"
        )
        if guess < step:  # nothing fits: confirm at the smallest batch
            if at(step) > limit:
                best = 0
                how.append(f"verified: the smallest batch {step} does not fit")
                break
            guess = step
        at(guess), at(guess + step)
        below = [b for b in points if points[b] <= limit]
        above = [b for b in points if points[b] > limit]
        if below and above and min(above) - max(below) == step:
            best = max(below)
            how.append(f"verified by compiling batch {best} (fits) and {best + step} (does not)")
            break
        if round_ == MAX_REFITS:
            break
        # refit: interpolate between the measured batches either side of the limit, or, when all
        # measured batches are on one side, extrapolate on the widest baseline
        a, b = (max(below), min(above)) if below and above else (min(points), max(points))
        fixed, per_row = fit(points, a, b)
        how.append(f"refit through batch {a} and {b}")
    if best is None:
        below = [b for b in points if points[b] <= limit]
        best = max(below) if below else 0
        how.append(f"not converged after {MAX_REFITS} refits: the largest compiled batch that fits is given")
    return {
        "largest_batch": best,
        "fixed_bytes": fixed,
        "per_row_bytes": per_row,
        "compiled_totals": dict(sorted(points.items())),
        "how": "; ".join(how),
        "step": step,
    }
