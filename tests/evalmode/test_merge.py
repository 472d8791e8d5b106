"""`offscope merge`: four shards of a grid equal one unsharded run of it, field for field."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from offscope.cli import main
from offscope.evalmode.case import BUNDLED, load_cases
from offscope.evalmode.grid import parse_cells
from tests.support.gate_testlib import run_grid

CASES = load_cases(
    [
        BUNDLED / f"{n}.yaml"
        for n in (
            "billing-refund-revoked-mirror",
            "infra-flag-mcp-forbidden-parent-scope",
            "repo-ci-pin-forbidden-sibling-repo",
        )
    ]
)


def _grid(out: Path, shard: tuple[int, int] | None = None, reps: int = 2) -> Path:
    return run_grid(
        out, cases=CASES, cells=parse_cells("diagonal"), reps=reps, seed=3, shard=shard, workers=4
    )


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> tuple[Path, list[Path]]:
    tmp = tmp_path_factory.mktemp("shards")
    full = _grid(tmp / "full")
    return full, [_grid(tmp / f"shard{i}", (i, 4)) for i in range(4)]


def test_four_shards_equal_the_unsharded_run(shards, tmp_path: Path, capsys) -> None:
    full, parts = shards
    # given out of order: the merge orders runs canonically, not by argument order
    assert main(["merge", *map(str, reversed(parts)), "--out", str(tmp_path / "merged")]) == 0
    merged = json.loads((tmp_path / "merged" / "results.json").read_text())
    single = json.loads((full / "results.json").read_text())
    assert single["configuration"]["shard"] is None
    assert merged["configuration"]["shard"] is None
    for key in single:
        assert merged[key] == single[key], key
    assert merged == single
    assert len(merged["runs"]) == 3 * 2 * 2
    for name in ("report.md", "report.html", "trajectories.jsonl", "grid.json"):
        assert (tmp_path / "merged" / name).exists()
    # every shard really held a part of the grid
    sizes = [len(json.loads((p / "results.json").read_text())["runs"]) for p in parts]
    assert sum(sizes) == 12 and all(sizes)


def test_missing_shard_names_the_missing_runs(shards, tmp_path: Path, capsys) -> None:
    _, parts = shards
    assert main(["merge", *map(str, parts[:3]), "--out", str(tmp_path / "m")]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "planned run(s) are missing" in err and "shard(s) 3/4 not given" in err
    missing = json.loads((parts[3] / "results.json").read_text())["runs"]
    assert missing[0]["run"] in err.replace(" ", "")


def test_overlapping_shards_are_refused(shards, tmp_path: Path, capsys) -> None:
    full, parts = shards
    assert main(["merge", str(full), str(parts[0]), "--out", str(tmp_path / "m")]) == 2
    assert "in more than one shard" in " ".join(capsys.readouterr().err.split())


def test_shards_of_different_grids_are_refused(shards, tmp_path: Path, capsys) -> None:
    _, parts = shards
    odd = tmp_path / "odd"
    shutil.copytree(parts[1], odd)
    meta = json.loads((odd / "grid.json").read_text())
    meta["configuration"]["model"]["effort"] = "high"
    (odd / "grid.json").write_text(json.dumps(meta))
    assert (
        main(
            [
                "merge",
                str(parts[0]),
                str(odd),
                str(parts[2]),
                str(parts[3]),
                "--out",
                str(tmp_path / "m"),
            ]
        )
        == 2
    )
    err = " ".join(capsys.readouterr().err.split())
    assert "configuration differs" in err and "model" in err


def test_not_a_grid_directory(tmp_path: Path, capsys) -> None:
    assert main(["merge", str(tmp_path), "--out", str(tmp_path / "m")]) == 2
    assert "not a grid output directory" in " ".join(capsys.readouterr().err.split())


def test_merge_sums_the_shards_model_endpoint_stats(tmp_path: Path) -> None:
    """Two shards against a real loopback model that throttles: the merged results.json holds
    what both paid the endpoint (counts summed, the in-flight peak the larger), not the first
    shard's figures."""
    from offscope.evalmode.endpoint import RetryPolicy
    from offscope.evalmode.harness import LoopbackServer
    from tests.support.faulty_model import Faults, FaultyModel

    model = FaultyModel(latency=0, faults=Faults(0.4, 0.1, 0, retry_after="0"), seed=1)
    retry = RetryPolicy(retries=2, base=0.01, cap=0.02, read_timeout=5.0)
    with LoopbackServer(model, "model") as srv:
        parts = [
            run_grid(
                tmp_path / f"shard{i}",
                cases=CASES,
                cells=parse_cells("diagonal"),
                reps=2,
                seed=3,
                shard=(i, 2),
                workers=4,
                model_url=srv.url + "/v1",
                model="m",
                retry=retry,
                operator_timeout=0,
            )
            for i in range(2)
        ]
    stats = [json.loads((p / "results.json").read_text())["model_endpoint_stats"] for p in parts]
    merge = ["merge", *map(str, parts), "--out", str(tmp_path / "merged")]
    assert main([*merge, "--max-infra-errors", "1000"]) == 0
    merged = json.loads((tmp_path / "merged" / "results.json").read_text())
    got = merged["model_endpoint_stats"]
    assert (
        got == json.loads((tmp_path / "merged" / "grid.json").read_text())["model_endpoint_stats"]
    )
    # the shards really paid: retries in both, and at least one run out of budget
    assert all(s["agent_retries"] > 0 for s in stats), stats
    assert got["upstream_calls"] == model.calls == sum(s["upstream_calls"] for s in stats)
    for key in ("agent_retries", "infra_errors", "upstream_failures"):
        assert got[key] == sum(s[key] for s in stats), key
    assert got["infra_errors"] == len(merged["infra_errors"]) > 0
    assert got["statuses"]["429"] == sum(s["statuses"].get("429", 0) for s in stats)
    assert got["limiter"]["throttled"] == sum(s["limiter"]["throttled"] for s in stats)
    assert got["limiter"]["peak_in_flight"] == max(s["limiter"]["peak_in_flight"] for s in stats)
    assert got["cache"]["misses"] == sum(s["cache"]["misses"] for s in stats)


def test_combine_stats_sums_counts_and_keeps_the_largest_peak() -> None:
    from offscope.evalmode.endpoint import combine_stats

    a = {
        "calls": 3,
        "statuses": {"200": 2, "429": 1},
        "limiter": {"peak_in_flight": 4},
        "cache": None,
    }
    b = {"calls": 5, "statuses": {"200": 5}, "limiter": {"peak_in_flight": 2}, "cache": None}
    assert combine_stats([a, b]) == {
        "calls": 8,
        "statuses": {"200": 7, "429": 1},
        "limiter": {"peak_in_flight": 4},
        "cache": None,
    }
    assert combine_stats([None, None]) is None
