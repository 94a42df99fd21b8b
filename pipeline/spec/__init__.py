"""tailguard/v1 files as plain validated data: SLO specs, control policies, burn rules,
contracts, and OpenSLO import/export.

:mod:`pipeline.spec.loader` is the one loader (YAML, issues with paths and lines,
messages); one module per kind holds its models and its ``load_*`` functions and
declares ``SPEC_KIND`` for :mod:`pipeline.spec.registry`. The core's evaluators
take these values and compile them into their runtime form; nothing in
:mod:`pipeline.core` reads a file.
"""
