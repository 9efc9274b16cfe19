"""The report's parts: one module per part (``table1``, ``fig3`` ... ``fig6``, ``paper_claims``),
each a ``base.Part`` with its typed result; ``registry`` orders them and selects a sweep's. Shared
below them: ``records`` (what the run directories hold, cells over seeds), ``md`` (Markdown) and
``plot`` (matplotlib)."""
