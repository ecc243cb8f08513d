"""Node classes for the process-lifetime tests, swapped into topologies with ``impl:``."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from nodes.actor import Actor


class ForkingCrasher(Actor):
    """Starts a long-lived grandchild (as a simulator or a worker pool would), writes its
    pid into the run directory, then crashes."""

    def setup(self) -> None:
        child = subprocess.Popen(["sleep", "300"])  # stays in our process group
        Path(self.ctx.run_dir, f"grandchild-{self.ctx.label}.pid").write_text(str(child.pid))
        raise RuntimeError(f"crashing on purpose, leaving pid {child.pid} behind ({os.getpid()})")
