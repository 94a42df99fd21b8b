"""The user's commands, one module each (``tailguard <command>``): what they compute and
print, over the core and the adapters. ``commands/`` is the CLI: one module per command
(or small group) registering its flags and handler in one table; ``pipeline.cli`` builds
the parser from it and dispatches.

* ``replay`` / ``replay_text``: the core over a file, and its summary as text
* ``report`` / ``report_html``: the SRE report from the store, as text, JSON or HTML
* ``statement``: a tenant's contract statement for a billing month
* ``backtest``: a trace through the simulator once per control loop
* ``demo``: broker, simulator, worker and store together, then the report
* ``explain``, ``capacity``, ``sql`` (``commands/store_queries``): one request's
  story, the capacity model, read-only SQL over the store
"""
