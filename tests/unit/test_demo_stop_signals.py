"""``tailguard demo``'s stop: the first SIGTERM or SIGINT unwinds it (exit 143 or 130);
later ones are ignored, so they cannot cut short the stopping of what it started."""

from __future__ import annotations

import signal

import pytest

from pipeline.app.commands.demo import STOP_SIGNALS, _stop


@pytest.mark.parametrize("first", [signal.SIGTERM, signal.SIGINT])
def test_the_first_stop_signal_unwinds_and_later_ones_are_ignored(first: signal.Signals) -> None:
    before = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    try:
        for sig in STOP_SIGNALS:
            signal.signal(sig, _stop)
        with pytest.raises(KeyboardInterrupt, match=first.name):
            _stop(first, None)
        assert {sig: signal.getsignal(sig) for sig in STOP_SIGNALS} == dict.fromkeys(
            STOP_SIGNALS, signal.SIG_IGN
        )
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
