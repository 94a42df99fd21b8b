"""The ``tailguard`` commands, one table: each module here registers its own flags and
handler as a :class:`~pipeline.app.commands.common.Command`; :mod:`pipeline.cli` builds
the parser from :data:`COMMANDS` (in this order, as ``--help`` lists them) and dispatches.

These modules are the CLI: they build the settings (:mod:`.settings`, the one place) and
call :mod:`pipeline.app`, the adapters and the producers. Nothing below them imports
them (tests/unit/test_packaging.py). To add a command: a module with its ``Command``,
and a line in the table.
"""

from __future__ import annotations

from pipeline.app.commands.backtest import BACKTEST
from pipeline.app.commands.common import Command
from pipeline.app.commands.demo import DEMO
from pipeline.app.commands.envoy import ENVOY
from pipeline.app.commands.gateway import GATEWAY
from pipeline.app.commands.migrate import MIGRATE
from pipeline.app.commands.replay import REPLAY
from pipeline.app.commands.report import REPORT
from pipeline.app.commands.rules import RULES
from pipeline.app.commands.simulate import SIMULATE
from pipeline.app.commands.specs import OPENSLO, SCHEMA, VALIDATE
from pipeline.app.commands.statement import STATEMENT
from pipeline.app.commands.store_queries import CAPACITY, EXPLAIN, SQL
from pipeline.app.commands.topics import TOPICS
from pipeline.app.commands.vllm_scrape import VLLM_SCRAPE
from pipeline.app.commands.worker import WORKER

__all__ = ["COMMANDS", "Command"]

COMMANDS: tuple[Command, ...] = (
    SCHEMA,
    TOPICS,
    MIGRATE,
    WORKER,
    SIMULATE,
    REPLAY,
    VALIDATE,
    REPORT,
    STATEMENT,
    EXPLAIN,
    CAPACITY,
    SQL,
    GATEWAY,
    OPENSLO,
    ENVOY,
    VLLM_SCRAPE,
    RULES,
    BACKTEST,
    DEMO,
)
