"""Load simulator: replays an Azure-format LLM trace as v1 gateway and engine events.

* :mod:`producers.simulator.trace` — read the trace (pure).
* :mod:`producers.simulator.model` — the discrete-event model (pure, deterministic): its
  settings (:mod:`~producers.simulator.config`), state and output
  (:mod:`~producers.simulator.state`), engines and gateways
  (:mod:`~producers.simulator.engines`, :mod:`~producers.simulator.gateways`).
* :mod:`producers.simulator.run` — the shell: pacing, sink, progress bar.
* :mod:`producers.simulator.gate` — gateways applying control directives (closed loop).
* :mod:`producers.simulator.baselines` — gateway-local adaptive limiters (AIMD).
"""

from producers.simulator.model import (
    DEFAULT_MODELS,
    ModelConfig,
    OverloadEpisode,
    SimConfig,
    SimSummary,
    Simulator,
    engine_hosts,
    simulate,
)
from producers.simulator.trace import TraceRequest, read_trace

__all__ = [
    "DEFAULT_MODELS",
    "ModelConfig",
    "OverloadEpisode",
    "SimConfig",
    "SimSummary",
    "Simulator",
    "TraceRequest",
    "engine_hosts",
    "read_trace",
    "simulate",
]
