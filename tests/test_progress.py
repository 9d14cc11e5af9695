"""`sentinel.progress.phase` in a log (a console that is not a terminal): a line when the phase
starts, one every `LOG_EVERY_S` seconds while it runs however long one step takes, one at the
end."""

from __future__ import annotations

import io
import time

import pytest
from rich.console import Console

from sentinel import progress


def test_a_long_step_still_prints_a_line_every_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(progress, "LOG_EVERY_S", 0.05)
    out = io.StringIO()
    console = Console(file=out, force_terminal=False, width=200)
    with progress.phase(console, "SFT cold start", 3) as update:
        update(1)
        time.sleep(0.3)  # one step far longer than the interval
        update(3)
    lines = out.getvalue().splitlines()
    assert lines[0] == "SFT cold start: 3 to do"
    beats = [line for line in lines if "after" in line]
    assert len(beats) >= 2 and all(b.startswith("SFT cold start: 1/3 after") for b in beats)
    assert lines[-1].startswith("SFT cold start: 3/3 in ")
    count = len(out.getvalue().splitlines())
    time.sleep(0.2)  # the heartbeat stopped with the phase
    assert len(out.getvalue().splitlines()) == count
