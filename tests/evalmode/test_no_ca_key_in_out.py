"""A grid's --out holds no private key: its CA is throwaway and lives outside it."""

from __future__ import annotations

import asyncio
from pathlib import Path

from offscope.evalmode.case import BUNDLED, load_cases
from offscope.evalmode.grid import Grid, GridConfig, parse_cells


def test_grid_out_has_no_private_key_and_resume_still_runs(tmp_path: Path) -> None:
    out = tmp_path / "grid"
    cases = load_cases([BUNDLED])[:1]
    cfg = GridConfig(cases=cases, cells=parse_cells("diagonal"), reps=1, out=out, seed=2)
    asyncio.run(Grid(cfg).run())
    (out / "trajectories.jsonl").write_text(  # as if the second run had not finished
        "".join(
            line
            for line in (out / "trajectories.jsonl").read_text().splitlines(keepends=True)
            if "open-affirmative" not in line
        )
    )
    summary = asyncio.run(Grid(cfg).run())  # the resume gets a new throwaway CA
    assert summary["ran"] == 1
    files = [p for p in out.rglob("*") if p.is_file()]
    assert files and not [p for p in files if b"PRIVATE KEY" in p.read_bytes()]
    assert not (out / ".ca").exists()
