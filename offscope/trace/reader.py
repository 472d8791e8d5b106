"""Reading many traces as one stream: a fleet's files, a day of rotated segments.

`read_traces(["/var/log/offscope/*.jsonl*"])` expands globs, gathers each trace with
its rotated segments (`NAME.1`, `NAME.2`, ... as the proxy rotates them, and the same
compressed by a log shipper: `NAME.3.gz`, `NAME.4.zst`), reads each trace's segments
oldest first, and merges the traces by timestamp. It holds one event per trace in
memory, whatever the number of events, so a reader that folds as it goes (the
`Folder` of offscope/trace/metrics.py) stays flat in memory.

Runs are told apart by (sidecar, run): a proxy started with `--instance` stamps its
records, and two sidecars' `run-1` are two runs.
"""

from __future__ import annotations

import glob
import heapq
import itertools
import re
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from offscope.errors import InputError
from offscope.jsonl import COMPRESSED_SUFFIXES
from offscope.trace.events import Event, read_trace

# NAME, NAME.N, NAME.N.gz, NAME.N.zst (N: the rotation index, 1 the newest rotated)
_SEGMENT = re.compile(r"^(?P<base>.+?)(?:\.(?P<index>\d+))?(?P<zip>\.gz|\.zst)?$")


def _segment_key(path: Path) -> tuple[Path, int]:
    """(the trace a file is a segment of, its rotation index: 0 for the live file)."""
    m = _SEGMENT.match(path.name)
    assert m is not None  # the pattern matches every name
    base = m.group("base")
    if m.group("index") is None and m.group("zip") is None:
        return path, 0
    return path.with_name(base), int(m.group("index") or 0)


def _rotated_beside(trace: Path) -> list[Path]:
    """The rotated segments the proxy (or a shipper) left beside a live trace file."""
    if not trace.parent.is_dir():
        return []
    prefix = trace.name + "."
    return [
        p
        for p in trace.parent.iterdir()
        if p.name.startswith(prefix) and p.is_file() and _segment_key(p)[0] == trace
    ]


def trace_groups(specs: Sequence[str | Path]) -> list[list[Path]]:
    """The traces the specs name, each as its segments oldest first. A spec is a file
    (its rotated segments come with it) or a glob; a spec that names nothing is an
    error, and no file is read twice."""
    files: set[Path] = set()
    for spec in specs:
        text = str(spec)
        if glob.has_magic(text):
            matched = [Path(p) for p in sorted(glob.glob(text)) if Path(p).is_file()]
            if not matched:
                raise InputError(f"no trace file matches {text!r}", hint="check the pattern")
            files.update(matched)
            continue
        path = Path(text)
        if not path.is_file():
            raise InputError(
                "no such trace file" if not path.exists() else "not a trace file",
                path=text,
                hint="give a trace (.jsonl, .jsonl.gz, .jsonl.zst) or a glob such as "
                "'traces/*.jsonl*'",
            )
        files.add(path)
        if path.suffix not in COMPRESSED_SUFFIXES and _segment_key(path)[1] == 0:
            files.update(_rotated_beside(path))
    groups: dict[Path, list[tuple[int, Path]]] = {}
    for path in files:
        trace, index = _segment_key(path)
        groups.setdefault(trace, []).append((index, path))
    return [
        [p for _, p in sorted(segments, key=lambda s: (-s[0], s[1].name))]
        for _, segments in sorted(groups.items())
    ]


def read_traces(specs: Sequence[str | Path]) -> Iterator[Event]:
    """Every event of the named traces, each trace's segments in order, the traces
    merged by timestamp (one event per trace held at a time)."""
    streams = [_chain(group) for group in trace_groups(specs)]
    if len(streams) == 1:
        return streams[0]
    return heapq.merge(*streams, key=lambda e: e.ts)


def _chain(segments: Iterable[Path]) -> Iterator[Event]:
    return itertools.chain.from_iterable(read_trace(p) for p in segments)
