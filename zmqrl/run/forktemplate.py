"""Imported by the fork template alone (the ``multiprocessing`` fork server that
:mod:`zmqrl.run.forkstart` preloads): it shares the supervisor's process group, so a
SIGTERM or SIGHUP sent to that group (``kill -- -PGID``, a closed terminal) must not end
it before the supervisor has stopped the nodes it forked; they would get their death
signal twice. It ends when the supervisor does (its pipe from the supervisor closes),
SIGKILL included. Each forked node restores the default handlers at once."""

from __future__ import annotations

import signal

for _sig in (signal.SIGTERM, signal.SIGHUP):
    signal.signal(_sig, signal.SIG_IGN)
