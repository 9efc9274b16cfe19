"""Benchmarks and planning, built on the core and never imported by it.

``measurement`` (the one timing rule, the machine probes, JSON, Markdown tables), ``bench_models``
(the benchmarks' models and inputs), ``bench_decode`` (with ``decode_loops``, ``decode_floor``,
``bench_hf``), ``bench_step``, ``bench_train``, ``plan`` (with ``compiled_memory``,
``batch_search``), ``t_infer`` (the ``time`` stage: T_infer per sample) and ``info``.
"""
