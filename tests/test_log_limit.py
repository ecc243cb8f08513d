"""Rejections are logged rate-limited (issue 29, Low 4): a peer that sends garbage
without end must not fill the log disk. The first lines of each window are written, the
rest counted, and the next line written says how many were not."""

from __future__ import annotations

import logging

from zmqrl.bus import loglimit
from zmqrl.bus.loglimit import LimitedLog


def test_a_flood_of_rejections_writes_a_bounded_log(monkeypatch, caplog):
    now = [1000.0]
    monkeypatch.setattr(loglimit.time, "monotonic", lambda: now[0])
    log = LimitedLog(logging.getLogger("flood"), burst=20, window_s=10.0)
    with caplog.at_level(logging.ERROR, logger="flood"):
        for i in range(5000):
            log.error(f"rejected message {i}")
        assert len(caplog.records) == 20  # not 5000
        now[0] += 10.0  # the next window
        log.error("rejected message after")
    lines = [r.getMessage() for r in caplog.records]
    assert lines[20] == "(4980 more like the below not logged; bad_messages counts them all)"
    assert lines[21] == "rejected message after"
