"""A stop signal is acted on while the event loop is held by a long batch (real signals,
a real asyncio loop in a child process): the stop thread runs at once, the overdue exit
follows its grace, and the loop's own handler still runs whenever the loop is free."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from tests.paths import REPO as ROOT

pytestmark = pytest.mark.integration


CHILD = textwrap.dedent(
    """
    import asyncio, os, signal, sys, threading, time
    from pipeline.adapters.stop_signal import PromptStop

    def say(line):  # one write per line: the stop thread and the loop print concurrently
        os.write(1, (line + "\\n").encode())

    seen = threading.Event()
    def on_signal(sig):
        say(f"stop thread: signal {sig}")
        seen.set()

    loop = asyncio.new_event_loop()
    def loop_handler():
        say("loop handler")
        loop.stop()
    loop.add_signal_handler(signal.SIGTERM, loop_handler)
    loop.add_signal_handler(signal.SIGINT, loop_handler)
    def overdue():
        say("overdue")
        os._exit(3)
    PromptStop(on_signal, overdue, grace_s=float(sys.argv[2])).install()

    async def held():  # a batch that keeps the loop: pure Python, no await
        end = time.monotonic() + 120
        say("ready")
        while time.monotonic() < end:
            pass

    async def idle():
        say("ready")
        await asyncio.sleep(120)

    try:
        loop.run_until_complete(held() if sys.argv[1] == "held" else idle())
    except RuntimeError:  # stopped by its handler before the coroutine ended
        say("loop stopped")
    seen.wait(30)
    sys.exit(0)
    """
)


def _run(state: str, sig: signal.Signals, grace_s: float) -> tuple[int, list[str]]:
    """The child's exit status and its output lines."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, state, str(grace_s)],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        proc.send_signal(sig)
        out, _ = proc.communicate(timeout=60)  # the child's own busy loop lasts 120 s
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, out.splitlines()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_held_loop_does_not_delay_the_stop(sig: signal.Signals) -> None:
    rc, lines = _run("held", sig, grace_s=0.5)
    text = " ".join(lines)
    assert rc == 3, text  # ended by the overdue exit, long before the held loop let go
    assert f"stop thread: signal {int(sig)}" in text
    assert text.index("stop thread") < text.index("overdue")
    assert "loop handler" not in text  # the loop never got back to its selector


def test_a_free_loop_still_gets_its_own_handler() -> None:
    rc, lines = _run("idle", signal.SIGTERM, grace_s=60.0)
    text = " ".join(lines)
    # The loop's handler stopped it and the child ended normally, before any overdue exit.
    # (The stop thread's line may come anywhere: it runs beside the loop.)
    assert rc == 0, text
    assert "loop handler" in lines, text
    assert "loop stopped" in lines, text
    assert lines.index("loop handler") < lines.index("loop stopped"), text
    assert "stop thread: signal 15" in text
    assert "overdue" not in text
