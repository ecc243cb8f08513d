"""What a test run of a topology must reach: its ``expect:`` section, with defaults.

A topology declares its own bar, so adding a file to topologies/ needs no test edit::

    expect:
      return: 150        # mean return of the last 100 episodes; omitted or null: runs only
      seconds: 180       # bounds a failing run (the run stops as soon as it reaches `return`)
      min_updates: 10    # the learner (or parameter server) updates at least this often
      set: ["env.id=InvertedPendulum-v5"]   # --set overrides for the test run
      tested_by: "tests/test_pixels.py: ..."  # run elsewhere; the generic test skips it
      long: true         # the return takes minutes: asked only with ZMQRL_LONG_TESTS=1;
      seconds_short: 60  # otherwise the run, bounded by this, moves data and updates

A run stops as soon as it reaches its return; the seconds (~2x the time to that return
measured on a loaded 2-core machine) only bound a failing run. A run asked no return stops
as soon as data has crossed every link and the learner has updated ``min_updates`` times
(tests/runs.py); its seconds, too, only bound a failing run.

A topology without the section (or a field left out) gets :data:`RUNS_ONLY`'s values: it
is run, data must cross every link and the learner update, but no return is asked of it.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from zmqrl.run.topology import SCHEMA, Topology


@dataclass(frozen=True)
class Expectation:
    target: float | None = None  # `return:` (None: runs only, no return asked)
    seconds: float = 60
    min_updates: int = 1
    sets: tuple[str, ...] = ()  # `set:`
    tested_by: str | None = None  # where the file's run lives instead, and why
    long: bool = False  # `long:` its return is asked on request (ZMQRL_LONG_TESTS=1)
    seconds_short: float = 60  # `seconds_short:` a long file's run without its return

    @classmethod
    def parse(cls, section: dict[str, Any] | None, source: str = "<topology>") -> Expectation:
        """The ``expect`` section checked against the topology schema; ValueError if bad."""
        section = {} if section is None else section
        try:
            jsonschema.validate(section, SCHEMA["properties"]["expect"])
        except jsonschema.ValidationError as exc:
            raise ValueError(f"{source}: expect: {exc.message}") from None
        return cls(target=section.get("return", cls.target),
                   seconds=section.get("seconds", cls.seconds),
                   min_updates=section.get("min_updates", cls.min_updates),
                   sets=tuple(section.get("set", cls.sets)),
                   tested_by=section.get("tested_by", cls.tested_by),
                   long=section.get("long", cls.long),
                   seconds_short=section.get("seconds_short", cls.seconds_short))

    def for_this_run(self) -> Expectation:
        """What this test run asks: a ``long`` file's return only with ZMQRL_LONG_TESTS=1
        (CI's 20 minutes hold no run of several minutes); otherwise the data path and the
        updates, for ``seconds_short``."""
        if not self.long or os.environ.get("ZMQRL_LONG_TESTS"):
            return self
        return dataclasses.replace(self, target=None, seconds=self.seconds_short)


RUNS_ONLY = Expectation()


def expectation(topo_or_path: Topology | str | Path) -> Expectation:
    """The expectation of a loaded topology, or of a topology file. A file is read as
    plain YAML (its expect section checked, nothing else), so one run elsewhere (a pixel
    env whose extras are not installed) can be skipped without loading it."""
    if isinstance(topo_or_path, Topology):
        return Expectation.parse(topo_or_path.expect, topo_or_path.source)
    raw = yaml.safe_load(Path(topo_or_path).read_text())
    section = raw.get("expect") if isinstance(raw, dict) else None
    return Expectation.parse(section, str(topo_or_path))
