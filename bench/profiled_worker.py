"""``python -m bench.profiled_worker worker``: the tailguard CLI under pyinstrument.

The profile of the main thread (the Faust event loop: decoding, join, windows,
record building; ClickHouse writes run on the writer thread and show up here
only as waits) is written as text to ``$TAILGUARD_BENCH_PROFILE`` when the
process exits (SIGTERM included).
"""

from __future__ import annotations

import atexit
import os
from pathlib import Path

from pyinstrument import Profiler


def main() -> int:
    out = Path(os.environ["TAILGUARD_BENCH_PROFILE"])
    prof = Profiler(interval=0.001, async_mode="disabled")
    prof.start()

    def dump() -> None:
        prof.stop()
        out.write_text(prof.output_text(unicode=False, color=False, show_all=False))

    atexit.register(dump)
    from pipeline.cli import main as cli_main

    return cli_main()


if __name__ == "__main__":
    raise SystemExit(main())
