"""The guardian: ends every process a torchrepro started once that torchrepro is gone, however it
ended (``kill -9``, the OOM killer, a scheduler, a normal exit). Standard library only, run as
``python -I -S _guardian.py PID`` by :mod:`torchrepro.commands.launcher` (once per torchrepro
process, in a session of its own, so that a signal to torchrepro's process group spares it), with
its stdin the read end of a pipe whose write end only torchrepro holds.

While torchrepro (``PID``) lives, every :data:`INTERVAL` s it records each new descendant of it
(pid and start time, so that a reused pid is never taken for one seen). The kernel closes the
pipe when torchrepro ends: then the guardian freezes what it recorded (SIGSTOP, then the children
the frozen ones started meanwhile, until none is new), SIGKILLs it all and exits. This is what
ends a process that left the job's process group and session (``setsid``,
``start_new_session=True``, a double-forked daemon) and runs no Python: the kernel's parent-death
signal reaches only the job's first process. After a normal exit the launcher has already ended
every job, and the guardian finds nothing left to end."""

from __future__ import annotations

import os
import select
import signal
import sys
import time

INTERVAL = 0.2  # s between two looks at /proc while torchrepro lives
FREEZE_ROUNDS = 50  # looks for children of frozen processes before giving up on stragglers


def _stat(pid: int) -> tuple[int, int, str] | None:
    """``(ppid, start time, state)`` of process ``pid`` from ``/proc``; None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fp:
            fields = fp.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[1]), int(fields[19]), fields[0].decode()


def _pids() -> set[int]:
    return {int(entry) for entry in os.listdir("/proc") if entry.isdigit()}


class Tree:
    """The descendants of one process as seen so far (pid -> start time). Each look reads only
    the processes new since the last: one that was not a descendant never becomes one (an orphan
    goes up its own line of ancestors), so only new pids can join."""

    def __init__(self, root: int):
        start = _stat(root)
        self.root = root
        self.inside: dict[int, int] = {} if start is None else {root: start[1]}
        self.outside = {os.getpid()}  # the guardian is never one of them

    def look(self) -> None:
        """Record the descendants started since the last look (parents before their children)."""
        pids = _pids()
        self.outside &= pids  # a pid gone and then reused is read again
        self.inside = {pid: start for pid, start in self.inside.items() if pid in pids}
        new = {}
        for pid in sorted(pids - self.outside - self.inside.keys()):
            stat = _stat(pid)
            if stat is not None:
                new[pid] = stat
        grew = True
        while grew:
            grew = False
            for pid, (ppid, start, _state) in list(new.items()):
                if ppid in self.inside:
                    self.inside[pid] = start
                    del new[pid]
                    grew = True
        self.outside |= new.keys()

    def alive(self) -> dict[int, str]:
        """The recorded processes still running (not the root, not zombies): pid -> state."""
        out = {}
        for pid, start in self.inside.items():
            stat = _stat(pid)
            if pid != self.root and stat is not None and stat[1] == start and stat[2] != "Z":
                out[pid] = stat[2]
        return out

    def adopt_children(self) -> bool:
        """Record the children of recorded processes started since the last look, wherever their
        parent is now; whether any was new. Reads every process: it runs only at the end."""
        new = False
        for pid in _pids() - self.inside.keys():
            stat = _stat(pid)
            if stat is not None and stat[0] in self.inside and pid != os.getpid():
                self.inside[pid] = stat[1]
                new = True
        return new


def _signal(pids: dict[int, str], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except OSError:  # gone meanwhile
            pass


def end(tree: Tree) -> None:
    """Freeze every recorded process and what they started, then kill them all."""
    for _ in range(FREEZE_ROUNDS):
        alive = tree.alive()
        _signal(alive, signal.SIGSTOP)
        if all(state in "Tt" for state in alive.values()) and not tree.adopt_children():
            break
        time.sleep(0.01)
    _signal(tree.alive(), signal.SIGKILL)


def main(root: int) -> None:
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # torchrepro's to handle; this one ends after it
        signal.signal(sig, signal.SIG_IGN)
    tree = Tree(root)
    while True:
        tree.look()
        ready, _, _ = select.select([0], [], [], INTERVAL)
        if ready and not os.read(0, 512):  # end of file: torchrepro is gone
            break
    tree.look()
    end(tree)


if __name__ == "__main__":
    main(int(sys.argv[1]))
