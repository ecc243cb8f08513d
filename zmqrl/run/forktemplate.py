"""Imported by the fork template alone (the ``multiprocessing`` fork server that
:mod:`zmqrl.run.forkstart` preloads): it shares the supervisor's process group, so a
SIGTERM or SIGHUP sent to that group (``kill -- -PGID``, a closed terminal) must not end
it before the supervisor has stopped the nodes it forked; they would get their death
signal twice. It ends when the supervisor does (its pipe from the supervisor closes),
SIGKILL included. Each forked node restores the default handlers at once.

It also silences one warning in every node it forks (they inherit its filters): the
template imported ``zmqrl.cli``, and each child runs that module again, as ``__main__``
(what ``python -m`` does) and, where the supervisor itself is ``python -m zmqrl.cli``, as
``__mp_main__`` too (``multiprocessing`` re-runs the parent's main module before the
target). Defining the commands twice is harmless; runpy's warning of it is noise."""

from __future__ import annotations

import signal
import warnings

for _sig in (signal.SIGTERM, signal.SIGHUP):
    signal.signal(_sig, signal.SIG_IGN)

warnings.filterwarnings("ignore", category=RuntimeWarning,
                        message="'zmqrl.cli' found in sys.modules")
