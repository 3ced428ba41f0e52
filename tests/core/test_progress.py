"""The shared stage progress (:mod:`specdraft.core.progress`): plain lines off a terminal, at
least one every ``interval_s`` (a fake clock, no sleeps), values computed by hand."""

from __future__ import annotations

import io

from specdraft.core.progress import StageProgress, human_seconds, quiet_library_bars


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_lines_by_hand():
    clock, out = Clock(), io.StringIO()
    p = StageProgress("extract", total=4000, unit="tokens", stream=out, interval_s=30,
                      clock=clock)
    clock.t += 10
    p.update(500, written="0.0 MiB")
    assert out.getvalue() == ""                       # not due before 30 s
    clock.t += 20                                      # 30 s: 1,000 tokens -> 33.3/s, 3,000 left
    p.update(500, written="1.0 MiB")
    assert out.getvalue() == ("extract: 1,000/4,000 tokens (25%), 33.3 tokens/s, elapsed 30s, "
                              "ETA 1m30s; written 1.0 MiB\n")
    clock.t += 90
    p.update(3000)                                     # 120 s: 4,000 -> 33.3/s, done
    p.close()
    lines = out.getvalue().splitlines()
    assert lines[1] == ("extract: 4,000/4,000 tokens (100%), 33.3 tokens/s, elapsed 2m00s, "
                        "ETA 0s; written 1.0 MiB")
    assert lines[2] == lines[1]                        # the final line at close
    assert "\r" not in out.getvalue()


def test_a_line_at_least_every_interval_while_nothing_finishes():
    """One unit of work runs 5 minutes (a batch, an engine start): the heartbeat still prints a
    line every 30 s, each with no carriage return."""
    clock, out = Clock(), io.StringIO()
    p = StageProgress("train", total=10, unit="steps", stream=out, interval_s=30, clock=clock)
    stamps = []

    def wait(seconds: float) -> bool:                  # the heartbeat's sleep, on a fake clock
        clock.t += seconds
        if out.getvalue().count("\n") > len(stamps):
            stamps.append(clock.t - 100)
        return clock.t - 100 > 300                     # stop after 5 minutes

    p.heartbeat(wait)
    assert "\r" not in out.getvalue()
    assert len(stamps) == 10 and stamps[0] <= 31 and \
        all(b - a <= 31 for a, b in zip(stamps, stamps[1:]))
    assert out.getvalue().splitlines()[0] == ("train: 0/10 steps (0%), 0.0 steps/s, elapsed 30s, "
                                              "ETA ?")


def test_render_initial_and_rank():
    clock, out = Clock(), io.StringIO()
    p = StageProgress("train", total=100, initial=40, unit="steps", stream=out, interval_s=30,
                      clock=clock)
    clock.t += 30
    p.update(30, **{"validation τ̂": "1.552"})        # 30 steps in 30 s since the resume
    assert out.getvalue() == ("train: 70/100 steps (70%), 1.0 steps/s, elapsed 30s, ETA 30s; "
                              "validation τ̂ 1.552\n")
    mine = StageProgress("g", stream=out, clock=clock, render=lambda s: f"custom {s:.0f}")
    clock.t += 30
    mine.tick()
    assert out.getvalue().endswith("custom 30\n")
    quiet = io.StringIO()
    other = StageProgress("x", total=3, stream=quiet, clock=clock, enabled=False)  # rank 1
    other.start()
    clock.t += 60
    other.update(3)
    other.close()
    assert quiet.getvalue() == ""


def test_a_terminal_gets_a_bar_and_a_log_does_not():
    tty = Tty()
    with StageProgress("extract", total=10, unit="tokens", stream=tty) as p:
        p.update(10)
    assert "\r" in tty.getvalue() and "100%" in tty.getvalue()  # tqdm redraws in place


def test_human_seconds_and_library_bars(monkeypatch):
    assert [human_seconds(s) for s in (0, 59.4, 61, 3599, 7620)] == \
        ["0s", "59s", "1m01s", "59m59s", "2h07m"]
    for name in ("HF_HUB_DISABLE_PROGRESS_BARS", "HF_DATASETS_DISABLE_PROGRESS_BARS"):
        monkeypatch.delenv(name, raising=False)
    quiet_library_bars(Tty())
    assert "HF_HUB_DISABLE_PROGRESS_BARS" not in __import__("os").environ
    quiet_library_bars(io.StringIO())
    import os

    assert os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] == "1"
    assert os.environ["HF_DATASETS_DISABLE_PROGRESS_BARS"] == "1"
