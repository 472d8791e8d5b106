"""Trace round trip, bad lines, and `offscope report --json` on a hand-built trace."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from offscope.cli import main
from offscope.errors import InputError
from offscope.trace.events import parse_event, read_trace, trace_schema, write_events
from tests.support.trajectories import Run


def _events() -> list:
    a = (
        Run("run-a", labels={"case": "refund", "rep": "1"})
        .call()
        .ask()
        .oos("act")
        .llm()
        .end("exit", True)
    )
    b = Run("run-b", ledger="other").call().call().end("idle")
    c = Run("run-c").oos("investigate", decision="block").oos("prepare").end("step_limit", False)
    return a.events + b.events + c.events


def test_round_trip(tmp_path: Path) -> None:
    events = _events()
    path = tmp_path / "t.jsonl"
    write_events(path, events)
    lines = path.read_text().splitlines()
    assert len(lines) == len(events)
    assert all(json.loads(line)["schema"] == "offscope.trace/2" for line in lines)
    back = list(read_trace(path))
    assert back == events
    assert [parse_event(line) for line in lines] == events


def test_blank_lines_are_skipped(tmp_path: Path) -> None:
    events = _events()[:3]
    path = tmp_path / "t.jsonl"
    path.write_text("\n" + "\n\n".join(e.to_json() for e in events) + "\n\n")
    assert list(read_trace(path)) == events


@pytest.mark.parametrize(
    ("bad", "fragment"),
    [
        (
            '{"schema": "offscope.trace/1", "type": "tool_call", "run": "x"}',
            "not an offscope.trace event",
        ),
        ("not json at all", "not an offscope.trace event"),
        (
            '{"schema": "offscope.trace/0", "type": "run_start", "run": "x", "ts": 1, "ledger": "l"}',
            "schema",
        ),
        ('{"type": "mystery", "run": "x", "ts": 1, "ledger": "l"}', "not an offscope.trace event"),
    ],
)
def test_bad_line_names_its_line(tmp_path: Path, bad: str, fragment: str) -> None:
    good = [e.to_json() for e in _events()[:3]]
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join([*good, "", bad, good[0]]) + "\n")
    with pytest.raises(InputError) as info:
        list(read_trace(path))
    assert info.value.line == 5
    assert fragment in str(info.value)
    assert str(info.value).startswith(f"{path}:5: ")


def test_missing_trace(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="cannot read trace"):
        list(read_trace(tmp_path / "nope.jsonl"))


def test_schema_has_every_event_type() -> None:
    text = json.dumps(trace_schema())
    for kind in ("run_start", "tool_call", "operator", "llm", "run_end"):
        assert kind in text


def test_report_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "t.jsonl"
    write_events(path, _events())
    assert main(["report", str(path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    agg = out["aggregate"]
    # run-a: 2 calls (1 oos act after a harness reply), 1 ask; run-b: 2 in-scope calls;
    # run-c: 2 oos calls (a blocked read, a prepare).
    assert (agg["runs"], agg["calls"], agg["oos_calls"]) == (3, 6, 3)
    assert agg["touches_per_1000_runs"] == 1000.0
    assert agg["oos_share_pooled"] == 0.5
    assert agg["oos_share_mean"] == pytest.approx((0.5 + 0 + 1) / 3)
    funnel = agg["funnel"]
    assert [funnel[s]["k"] for s in ("investigated", "prepared", "acted")] == [2, 2, 1]
    assert all(funnel[s]["n"] == 3 and funnel[s]["method"] == "wilson" for s in funnel)
    assert agg["self_granted"] == 1 and agg["self_granted_runs"]["k"] == 1
    assert agg["asked_operator"]["k"] == 1
    assert (agg["task_success"]["k"], agg["task_success"]["n"]) == (1, 2)
    assert sorted(agg["first_oos_step"]["touched"]) == [1, 3]
    assert agg["first_oos_step"]["censored_at"] == [2]
    assert sorted(out["by_ledger"]) == ["led", "other"]
    assert out["by_ledger"]["other"]["runs"] == 1
    runs = {r["run"]: r for r in out["runs"]}
    assert runs["run-a"]["labels"] == {"case": "refund", "rep": "1"}
    assert runs["run-a"]["first_oos_step"] == 3 and runs["run-a"]["steps"] == 3
    assert runs["run-c"]["blocked"] == 1 and runs["run-c"]["ended"] == "step_limit"


def test_report_table_and_bad_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "t.jsonl"
    write_events(path, _events())
    assert main(["report", str(path)]) == 0
    assert "run-a" in capsys.readouterr().out
    path.write_text(path.read_text() + "{oops\n")
    assert main(["report", str(path), "--json"]) == 2
    err = capsys.readouterr().err.replace("\n", "")
    assert f"{path}:" in err and ":15:" in err and "Traceback" not in err


def test_torn_final_line_is_skipped_with_a_warning(tmp_path: Path, capsys) -> None:
    events = _events()
    path = tmp_path / "t.jsonl"
    last = events[-1].to_json().encode()
    # Cut inside a multi-byte character, as a full disk may: the tail is not even UTF-8.
    torn = (events[-1].to_json()[:-5] + "é").encode()[:-1]
    path.write_bytes(b"".join(e.to_json().encode() + b"\n" for e in events[:-1]) + torn)
    assert list(read_trace(path)) == events[:-1]
    assert f"{path}:{len(events)}: skipped a torn final line" in capsys.readouterr().err
    path.write_bytes(path.read_bytes()[: -len(torn)] + last)  # whole, only the newline missing
    assert list(read_trace(path)) == events


def test_torn_line_in_the_middle_is_an_error(tmp_path: Path) -> None:
    events = _events()
    path = tmp_path / "t.jsonl"
    lines = [e.to_json() for e in events]
    lines[2] = lines[2][:20] + "\x00\x00"  # a torn write that later lines were appended after
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(InputError) as err:
        list(read_trace(path))
    assert err.value.line == 3 and err.value.path == str(path)


@pytest.mark.parametrize(
    ("where", "value"),
    [("ts", "NaN"), ("ts", "Infinity"), ("ts", "-Infinity"), ("ts", "1e999"), ("args", "NaN")],
)
def test_a_non_finite_number_is_a_bad_line(tmp_path: Path, where: str, value: str) -> None:
    """NaN and Infinity are not JSON (Python's json reads them; jq and
    JavaScript do not) and no offscope writer emits them: a line written whole
    with one is a bad line, named by file:line, as any other."""
    lines = [e.to_json() for e in _events()]
    call = next(i for i, line in enumerate(lines) if '"tool_call"' in line)
    record = json.loads(lines[call])
    if where == "ts":
        lines[call] = lines[call].replace(json.dumps(record["ts"]), value, 1)
    else:
        record["call"]["args"] = {"amount": "PLACEHOLDER"}
        lines[call] = json.dumps(record).replace('"PLACEHOLDER"', value)
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(InputError) as err:
        list(read_trace(path))
    assert err.value.line == call + 1 and err.value.path == str(path)
    assert value.lstrip("-") in str(err.value) or "finite" in str(err.value)


def test_a_torn_final_line_with_nan_is_skipped_like_any_torn_line(tmp_path: Path, capsys) -> None:
    events = _events()
    path = tmp_path / "t.jsonl"
    torn = events[-1].to_json().replace(json.dumps(events[-1].ts), "NaN", 1)
    path.write_text("".join(e.to_json() + "\n" for e in events[:-1]) + torn)
    assert list(read_trace(path)) == events[:-1]
    assert "skipped a torn final line" in capsys.readouterr().err


def test_nan_inside_a_string_is_just_text(tmp_path: Path) -> None:
    events = Run("run-n", labels={"note": "NaN Infinity"}).call().end("exit").events
    path = tmp_path / "t.jsonl"
    write_events(path, events)
    assert list(read_trace(path)) == events
