"""What a part of the report is (:class:`Part`), what it is given (:class:`Context`) and the rows it
adds to report.csv (:func:`csv_row`).

A part computes one typed result from the records, its schema (its ``Sweep.paper`` dict) and the
results of the parts before it, and shows it: Markdown lines, CSV rows, a figure where it has one.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Generic, TypeVar

from gqa_jax.experiments.parts.records import Record
from gqa_jax.experiments.stats import Stat

R = TypeVar("R")
CSV_COLUMNS = ("section", "row", "column", "ours_mean", "ours_std", "n_seeds", "paper")
CsvRow = tuple[Any, ...]  # CSV_COLUMNS' values


def csv_row(section: str, row: Any, column: Any, s: Stat | None, paper: Any = None) -> CsvRow:
    """One number of report.csv: ours (mean, std, seeds; empty and 0 where missing) and the paper's."""
    s = s or Stat(None)
    return (section, row, column, s.mean, s.std, s.n, paper)


@dataclasses.dataclass(frozen=True)
class Context:
    """What a part's ``compute`` sees beyond its records and schema."""

    paper: Mapping[str, Any]  # the sweep's whole paper dict
    parts: Sequence[Part[Any]]  # the parts of this report, in the registry's order
    results: Mapping[str, Any]  # part name -> result, of the parts computed before this one

    def proxy(self, name: str) -> str | None:
        """The proxy part ``name`` is scored on (``paper["proxy"][name]``), or None."""
        proxy = self.paper.get("proxy") or {}
        return proxy.get(name) if isinstance(proxy, Mapping) else None

    def taken_by_others(self, stage: str, name: str) -> list[str]:
        """The tags that mark ``stage`` runs as a part's other than ``name`` (:meth:`Part.takes`)."""
        tags = [t for p in self.parts if p.name != name for t in p.takes(self).get(stage, ())]
        return list(dict.fromkeys(tags))


class Part(abc.ABC, Generic[R]):
    """One part of the report (a table, a figure, a list of claims), computed into a result ``R``.

    Selection (``registry.schemas``): a part with a ``key`` reads its schema from ``paper[key]``
    when the paper dict nests the parts under their keys (the mini), or the whole paper dict when
    that has its ``flat_key`` (a sweep of one part); a part without a ``key`` is computed from the
    results of ``needs`` and is there when they all are.
    """

    name: str  # its report.csv section, its key in Numbers.results, its PNG's name
    key: str | None = None  # its Sweep.paper key when the parts are nested (the mini)
    flat_key: str | None = None  # a key that makes a flat Sweep.paper dict this part's schema
    needs: tuple[str, ...] = ()  # the parts whose results its compute reads (context.results)

    def takes(self, context: Context) -> Mapping[str, Sequence[str]]:
        """Stage -> tags: the runs of that stage with one of the tags are this part's, not the
        others' (Table 1 leaves them out)."""
        return {}

    @abc.abstractmethod
    def compute(self, records: Sequence[Record], schema: Mapping[str, Any], context: Context) -> R:
        """The part's numbers."""

    @abc.abstractmethod
    def markdown(self, result: R, files: Mapping[str, str]) -> list[str]:
        """Its section of report.md; ``files``: part name -> its PNG's path relative to the report."""

    def csv(self, result: R) -> list[CsvRow]:
        """Its rows of report.csv (none by default)."""
        return []

    def figure(self, result: R, path: Path) -> Path | None:
        """Draw its figure into ``path`` and return it; None where the part has no figure."""
        return None

    def __repr__(self) -> str:
        return f"<part {self.name}>"
