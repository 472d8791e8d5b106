"""A grid's output directory: its trace with every rotated segment, and its lock.

Segments. A proxy trace rotates by size: `trajectories.jsonl` is the newest
segment, `trajectories.jsonl.1` the one before, `.2` older still (offscope/proxy/
sinks.py). The grid's own trace never rotates (the grid sets the proxy's
rotation size to 0: a grid's trace is its result, and rotation keeps only a few
segments, deleting the oldest), but a directory written by an earlier offscope
(which rotated at 256 MiB), or a trace copied from a rotating proxy, may hold
segments. Everything that reads a grid's trace (results,
`offscope report DIR`, resume, `offscope merge`) reads it through `trace_events`
or `trace_lines`, so it sees every segment, oldest first; resume folds them back
into one file (`rewrite_trace`).

Lock. One process writes to an output directory at a time. `OutdirLock` holds
an exclusive `fcntl.flock` on `DIR/.offscope.lock` for as long as the grid runs;
a second process refuses (InputError, exit 2) and names the holder (pid, host,
start time, command), which the holder wrote into the file. The kernel releases
a flock when its process dies, however it dies, so a lock file left by a dead
process is simply taken over: there is no stale-lock guess by pid or age. flock
is reliable on local filesystems (an emptyDir, a local disk); on NFS it depends
on the server, which is one reason the Kubernetes shards write to local disk.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import socket
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import TracebackType

from offscope.errors import InputError
from offscope.jsonl import loads
from offscope.trace.events import Event, is_torn, read_trace, warn_torn

LOCK_NAME = ".offscope.lock"
# Where the worker processes of `offscope grid --processes N` write, one directory each
# (part-K/trajectories.jsonl, part-K/requests.jsonl), until the grid folds them into its own.
PARTS_DIR = ".processes"


# --------------------------------------------------------------------------- #
# A trace and its segments
# --------------------------------------------------------------------------- #


def trace_segments(trace: Path) -> list[Path]:
    """The trace's files, oldest first: NAME.N, ..., NAME.1, NAME (those that exist)."""
    pattern = re.compile(re.escape(trace.name) + r"\.(\d+)")
    rotated = []
    if trace.parent.is_dir():
        for p in trace.parent.iterdir():
            m = pattern.fullmatch(p.name)
            if m and p.is_file():
                rotated.append((int(m.group(1)), p))
    segments = [p for _, p in sorted(rotated, reverse=True)]
    return segments + ([trace] if trace.exists() else [])


def trace_exists(trace: Path) -> bool:
    return bool(trace_segments(trace))


def trace_events(trace: Path) -> Iterator[Event]:
    """Every event of the trace and its segments, in recorded order."""
    for segment in trace_segments(trace):
        yield from read_trace(segment)


def trace_lines(trace: Path) -> Iterator[tuple[str, str | None, dict]]:
    """(raw line with its newline, run id, parsed object) of every event line, oldest
    segment first. A torn final line of a segment is skipped with a warning; any other
    bad line raises InputError naming the segment and line."""
    for segment in trace_segments(trace):
        with segment.open(encoding="utf-8", errors="surrogateescape") as handle:
            for number, line in enumerate(handle, 1):
                if not line.strip():
                    continue
                try:
                    event = loads(line)  # NaN/Infinity are bad lines, as everywhere
                    run = event.get("run")
                except (ValueError, AttributeError):
                    if is_torn(line):
                        warn_torn(segment, number)
                        break
                    raise InputError(
                        "not an offscope.trace event", path=str(segment), line=number
                    ) from None
                yield (line if line.endswith("\n") else line + "\n"), run, event


def rewrite_trace(trace: Path, keep: Callable[[str | None], bool]) -> None:
    """Fold the trace and its segments into one file holding only the lines of the
    runs `keep` accepts. The new file replaces the trace before the old segments go:
    a crash in between leaves lines twice (which resume drops again), never none."""
    segments = trace_segments(trace)
    if not segments:
        return
    tmp = trace.with_name(trace.name + ".tmp")
    with tmp.open("w", encoding="utf-8", errors="surrogateescape") as dst:
        for line, run, _ in trace_lines(trace):
            if keep(run):
                dst.write(line)
    os.replace(tmp, trace)
    for old in segments:
        if old != trace:
            old.unlink(missing_ok=True)


def runs_of(trace: Path) -> tuple[dict[str, list[str]], set[str]]:
    """(run id -> its raw event lines in recorded order, the runs that ended) of a trace.
    A run ended by a stopping proxy did not end: resume runs it again. An event without a
    run id raises InputError (a grid's trace has none)."""
    runs: dict[str, list[str]] = {}
    finished: set[str] = set()
    for line, run, event in trace_lines(trace):  # every rotated segment, oldest first
        if run is None:
            raise InputError("an event without a run id", path=str(trace))
        runs.setdefault(run, []).append(line)
        if event.get("type") == "run_end" and event.get("detail") != "proxy stopped":
            finished.add(run)
    return runs, finished


def fold_parts(out: Path, trace: Path) -> None:
    """Append what the worker processes of a grid recorded (PARTS_DIR/part-K) to the
    grid's trace and request log, then remove the parts. Only runs that ended are kept,
    and none the trace already holds (a fold interrupted before it removed its parts is
    not counted twice); an unfinished run is dropped and resume runs it again."""
    root = out / PARTS_DIR
    if not root.is_dir():
        return
    parts = sorted(p for p in root.iterdir() if p.is_dir())
    present = set(runs_of(trace)[0]) if trace_exists(trace) else set()
    requests = trace.with_name("requests.jsonl")
    with (
        trace.open("a", encoding="utf-8", errors="surrogateescape") as dst,
        requests.open("a", encoding="utf-8", errors="surrogateescape") as log,
    ):
        for part in parts:
            part_trace = part / trace.name
            if trace_exists(part_trace):
                runs, finished = runs_of(part_trace)
                for run, lines in runs.items():
                    if run in finished and run not in present:
                        dst.writelines(lines)
                        present.add(run)
            for segment in trace_segments(part / requests.name):
                log.write(segment.read_text(encoding="utf-8", errors="surrogateescape"))
        dst.flush()
        os.fsync(dst.fileno())
    shutil.rmtree(root)


# --------------------------------------------------------------------------- #
# The lock
# --------------------------------------------------------------------------- #


def _holder_text(path: Path) -> str:
    try:
        info = json.loads(path.read_text(encoding="utf-8") or "{}")
    except (OSError, ValueError):
        info = {}
    if not isinstance(info, dict) or "pid" not in info:
        return "another process (it has not written its name yet)"
    return (
        f"pid {info.get('pid')} on {info.get('host')}, started {info.get('started')}"
        f" ({info.get('command', '?')})"
    )


class OutdirLock:
    """An exclusive lock on an output directory, held while a grid writes to it.

    Use as a context manager. Raises InputError (exit 2) naming the holder when
    another process has the directory."""

    def __init__(self, out: Path, what: str = "offscope grid", *, reading: bool = False) -> None:
        """`reading`: the holder only reads the directory (merge reading a shard): a
        directory that does not exist or cannot hold a lock file (read-only, e.g. a
        downloaded artifact) is read unlocked, since no offscope process writes there."""
        self.out = Path(out)
        self.path = self.out / LOCK_NAME
        self.what = what
        self.reading = reading
        self._fd: int | None = None

    def acquire(self) -> OutdirLock:
        if self.reading and not self.out.is_dir():
            return self
        if not self.reading:
            self.out.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            if self.reading:
                return self
            raise InputError(
                f"cannot create the lock file: {exc.strerror or exc}", path=str(self.path)
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise InputError(
                f"the output directory is in use by {_holder_text(self.path)}",
                path=str(self.out),
                hint="wait for that process to finish, or use another --out; "
                "two processes writing one directory would lose and re-pay runs",
            ) from None
        # Ours now (any earlier holder is dead: the kernel released its lock).
        me = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "command": " ".join([os.path.basename(sys.argv[0]), *sys.argv[1:]])[:300] or self.what,
        }
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(me).encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.ftruncate(fd, 0)  # the holder's name goes with it
            os.close(fd)  # closing releases the flock

    def __enter__(self) -> OutdirLock:
        return self.acquire()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()
