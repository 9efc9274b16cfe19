"""The report's parts in their order (:data:`PARTS`) and which of them a sweep has (:func:`schemas`).

A part is there when the sweep's ``paper`` dict gives it a schema: nested under the parts' keys
(``paper["table1"]``, ``paper["fig4"]``, ...: the mini) every part with a key is there, with ``{}``
where its key is absent; otherwise (a flat dict, a sweep of one part) the first part whose
``flat_key`` the dict has. A part without a key (Fig. 3, the claims) is there when every part it
needs is.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gqa_jax.experiments.parts import (
    fig3,
    fig4,
    fig5,
    fig6,
    paper_claims,
    paper_decode,
    sanity_claims,
    table1,
)
from gqa_jax.experiments.parts.base import Part
from gqa_jax.experiments.sweep import Sweep

PARTS: tuple[Part[Any], ...] = (
    table1.PART,
    fig3.PART,
    fig4.PART,
    fig5.PART,
    fig6.PART,
    paper_decode.PART,
    sanity_claims.PART,
    paper_claims.PART,
)


def check(parts: Sequence[Part[Any]]) -> None:
    """ValueError unless the names are distinct and each part comes after the parts it needs."""
    seen: list[str] = []
    for p in parts:
        if p.name in seen:
            raise ValueError(f"two report parts named {p.name}")
        if late := [n for n in p.needs if n not in seen]:
            raise ValueError(f"report part {p.name} needs {', '.join(late)}, which must come before it")
        seen.append(p.name)


def schemas(sweep: Sweep, parts: Sequence[Part[Any]] = PARTS) -> dict[str, Mapping[str, Any]]:
    """Part name -> its schema, for the parts the sweep has, in the order of ``parts``; ValueError
    when it has none (naming the keys looked for)."""
    check(parts)
    paper = sweep.paper
    keyed = [p for p in parts if p.key is not None]
    if any(isinstance(paper.get(p.key), Mapping) for p in keyed):
        found = {p.name: v if isinstance(v := paper.get(p.key), Mapping) else {} for p in keyed}
    else:
        flat = next((p for p in keyed if p.flat_key is not None and p.flat_key in paper), None)
        if flat is None:
            raise ValueError(
                f"sweep {sweep.name}: nothing to report: its paper dict has none of the keys "
                f"{', '.join(p.flat_key for p in keyed if p.flat_key)} (one part's schema) and none of "
                f"{', '.join(str(p.key) for p in keyed)} holding a dict (the parts nested under their keys)"
            )
        found = {flat.name: paper}
    out: dict[str, Mapping[str, Any]] = {}
    for p in parts:
        if p.name in found:
            out[p.name] = found[p.name]
        elif p.key is None and all(n in out for n in p.needs):
            out[p.name] = {}
    return out
