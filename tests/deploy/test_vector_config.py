"""deploy/vector/vector.toml against the trace model and docs/siem.md.

Vector is not packaged for the CI machines, so the config is not run: the
pipeline's wiring, every trace field its remaps read, and the mapping tables in
docs/siem.md are checked against offscope's own definitions instead."""

from __future__ import annotations

import gzip
import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any, get_args, get_origin

import pytest
from pydantic import BaseModel

from offscope.trace.events import LlmEvent, OperatorEvent, Target, ToolCallEvent
from tests.support.deploy_testlib import DEPLOY, REPO
from tests.support.trajectories import Run

CONFIG = DEPLOY / "vector" / "vector.toml"
SIEM_DOC = REPO / "docs" / "siem.md"
RECORDS: dict[str, type[BaseModel]] = {
    "tool_call": ToolCallEvent,
    "operator": OperatorEvent,
    "llm": LlmEvent,
}
# Component types the config may use (Vector's names).
KNOWN = {
    "sources": {"file"},
    "transforms": {"remap", "filter"},
    "sinks": {"http", "elasticsearch", "aws_s3"},
}


@pytest.fixture(scope="module")
def config() -> dict[str, Any]:
    return tomllib.loads(CONFIG.read_text(encoding="utf-8"))


def _fields(model: type[BaseModel]) -> dict[str, Any]:
    """Field name as written to the trace (alias) -> annotation."""
    return {(f.alias or name): f.annotation for name, f in model.model_fields.items()}


def _submodel(annotation: Any) -> type[BaseModel] | None:
    """The record model a field holds (through Optional and list)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):
        found = _submodel(arg)
        if found is not None:
            return found
    return None


def _resolves(path: str) -> bool:
    """Whether `a.b.c` is a field path of some call record (tool_call, operator, llm)."""
    for model in RECORDS.values():
        current: type[BaseModel] | None = model
        for part in path.split("."):
            fields = _fields(current) if current is not None else {}
            if part not in fields:
                break
            current = _submodel(fields[part])
        else:
            return True
    return False


def _remaps(config: dict[str, Any]) -> dict[str, str]:
    return {name: t["source"] for name, t in config["transforms"].items() if t["type"] == "remap"}


def test_the_pipeline_is_wired(config: dict[str, Any]) -> None:
    defined: set[str] = set()
    for section, types in KNOWN.items():
        assert config[section], f"no {section}"
        for name, component in config[section].items():
            assert component["type"] in types, (name, component["type"])
            defined.add(name)
    fed: set[str] = set()
    for section in ("transforms", "sinks"):
        for name, component in config[section].items():
            for source in component["inputs"]:
                base = source.removesuffix(".dropped")
                assert base in defined and base != name, f"{name}: unknown input {source}"
                fed.add(base)
    # Every source and transform feeds something; the call filter feeds both remaps.
    assert defined - set(config["sinks"]) <= fed
    assert {tuple(config["sinks"][s]["inputs"]) for s in config["sinks"]} == {
        ("offscope_ocsf",),
        ("offscope_ecs",),
        ("offscope_trace",),  # the raw trace: every record, not only the SIEM-mapped ones
    }
    assert config["sources"]["offscope_trace"]["include"][0].endswith("trace.jsonl}")
    for sink in config["sinks"].values():  # an outage must not lose events
        assert sink["buffer"]["type"] == "disk" and sink["buffer"]["when_full"] == "block"


def test_the_filter_keeps_exactly_the_call_records(config: dict[str, Any]) -> None:
    condition = config["transforms"]["offscope_calls"]["condition"]
    assert set(re.findall(r'\.type == "(\w+)"', condition)) == set(RECORDS)


def test_every_trace_field_the_remaps_read_exists(config: dict[str, Any]) -> None:
    target_fields = set(_fields(Target))
    read = 0
    for name, source in _remaps(config).items():
        if name == "offscope_parse":
            continue
        for path in re.findall(r"\brec\.([A-Za-z_][\w.]*)", source):
            assert _resolves(path), f"{name} reads rec.{path}, which no trace record has"
            read += 1
        for field in re.findall(r"\bt\.(\w+)", source):  # closures over call.targets
            assert field in target_fields, f"{name} reads target field {field!r}"
    assert read > 40


def test_the_ocsf_remap_sets_the_required_attributes(config: dict[str, Any]) -> None:
    source = _remaps(config)["offscope_ocsf"]
    assigned = set(re.findall(r"\bocsf\.(\w+)\s*=", source))
    # API Activity's required attributes, and the base event's.
    assert {
        "class_uid",
        "category_uid",
        "type_uid",
        "activity_id",
        "time",
        "severity_id",
        "metadata",
        "actor",
        "api",
        "src_endpoint",
    } <= assigned
    assert "ocsf.class_uid = 6003" in source and "600300 + int!(ocsf.activity_id)" in source
    assert '"version": "1.5.0"' in source


def _doc_rows() -> list[tuple[str, str, str]]:
    rows = []
    for line in SIEM_DOC.read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if (
            line.startswith("|")
            and len(cells) == 3
            and not set(cells[0]) <= {"-", " "}
            and cells[0] != "trace field"
        ):
            rows.append((cells[0], cells[1], cells[2]))
    return rows


def test_the_documented_mapping_matches_the_model_and_the_config(config: dict[str, Any]) -> None:
    rows = _doc_rows()
    assert len(rows) >= 30
    remaps = _remaps(config)
    ocsf_top = set(re.findall(r"\bocsf\.(\w+)", remaps["offscope_ocsf"]))
    ecs_top = set(re.findall(r'\becs\.("@timestamp"|\w+)', remaps["offscope_ecs"])) | {"@timestamp"}
    documented_trace_fields = set()
    for trace_cell, ocsf_cell, ecs_cell in rows:
        # The backticked names of a row's first cell are trace fields (`call.targets[].kind`).
        for name in re.findall(r"`([^`]+)`", trace_cell):
            path = name.replace("[]", "")
            assert _resolves(path), f"docs/siem.md maps `{path}`, which no trace record has"
            documented_trace_fields.add(path)
        for name in re.findall(r"`([a-z_@][\w.\[\]@]*)`", ocsf_cell):
            if name[0].isalpha() and "." in name or name in ocsf_top:
                assert name.split(".")[0].split("[")[0] in ocsf_top, (
                    f"OCSF {name} is not set by the remap"
                )
        for name in re.findall(r"`([a-z_@][\w.\[\]@]*)`", ecs_cell):
            if "." in name or name == "@timestamp":
                assert name.split(".")[0] in ecs_top, f"ECS {name} is not set by the remap"
    # Every field of a tool call the SIEM needs to decide on is documented.
    assert {
        "decision",
        "call.scope",
        "call.stage",
        "call.targets.value",
        "call.targets.grant",
        "status",
        "request_id",
        "traceparent",
        "started",
        "run",
        "ledger",
    } <= documented_trace_fields


def test_models_the_test_walks_are_the_trace_models() -> None:
    # Guards _submodel: a nested field the walk cannot enter would make paths unresolvable.
    call = _submodel(_fields(ToolCallEvent)["call"])
    assert call is not None and call.__name__ == "ToolCall"
    targets = _fields(call)["targets"]
    assert get_origin(targets) is list and _submodel(targets) is Target
    assert not _resolves("call.no_such_field") and _resolves("call.targets.in_scope")


def test_the_raw_trace_sink_writes_what_report_reads(
    config: dict[str, Any], tmp_path: Path
) -> None:
    """The S3 sink writes each line as written (text codec of the file source's
    message), newline-delimited and gzipped, as `.jsonl.gz` objects; objects of that
    shape from two pods, downloaded, are one fleet for `offscope report`. (Vector itself
    is not run here: it is not packaged for these machines.)"""
    sink = config["sinks"]["raw_trace_s3"]
    assert (sink["encoding"]["codec"], sink["framing"]["method"], sink["compression"]) == (
        "text",
        "newline_delimited",
        "gzip",
    )
    assert sink["filename_extension"] == "jsonl.gz" and "{{ host }}" in sink["key_prefix"]
    for pod, run in (("pod-a", Run("run-1").call().oos("act")), ("pod-b", Run("run-1").call())):
        for e in run.events:
            e.sidecar = pod
        lines = [(e.to_json() + "\n").encode() for e in run.events]
        day = tmp_path / "bucket" / "offscope" / pod / "2026-12-04"
        day.mkdir(parents=True)
        half = len(lines) // 2  # two objects per pod, as two batches would be
        for i, chunk in enumerate((lines[:half], lines[half:])):
            (day / f"1764806400-{i}.jsonl.gz").write_bytes(gzip.compress(b"".join(chunk)))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "offscope.cli",
            "report",
            "--json",
            str(tmp_path / "bucket/offscope/*/2026-12-04/*.jsonl.gz"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert sorted(r["run"] for r in report["runs"]) == ["pod-a/run-1", "pod-b/run-1"]
    runs = {r["run"]: r for r in report["runs"]}
    assert report["aggregate"]["runs"] == 2
    assert (runs["pod-a/run-1"]["oos_calls"], runs["pod-a/run-1"]["first_oos_act_step"]) == (1, 2)
    assert (runs["pod-b/run-1"]["oos_calls"], runs["pod-b/run-1"]["calls"]) == (0, 1)
