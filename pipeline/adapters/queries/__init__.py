"""Read SQL, one module per table family: the query text and the functions that run it.

==============  ==========================================================
module          tables
==============  ==========================================================
``requests``    ``requests`` (one row per request attempt)
``windows``     ``window_sketches``, ``latency_1m`` (latency sketches)
``budget``      ``slo_windows``, ``slo_1m``, ``slo_1h``, ``budget_events``
``counts``      the report's counts of the windows (``window_sketches``' ``__slo__``
                rows), ``request_counts_1h``, ``slo_bad_1h``, ``clock_skew_1h``
``control``     ``control_signals`` (the directives' audit trail)
``events``      ``lifecycle_events`` (raw events as received)
==============  ==========================================================

``filters`` turns a :class:`~pipeline.adapters.queries.filters.ReportFilter` into
conditions and bound parameters. The functions return rows as the engine gives them
(callers shape them); the insert side and the DDL are :mod:`pipeline.adapters.store`'s.
"""
