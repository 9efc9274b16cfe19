"""Experiments: sweeps as data (``sweep``), the runner that executes them (``runner``) and the
report rebuilt from their run directories (``report``). Above the core: nothing below imports it."""
