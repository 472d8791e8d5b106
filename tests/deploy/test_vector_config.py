"""deploy/vector/vector.toml against the trace model and docs/siem.md.

Vector is not packaged for the CI machines, so the config is not run: the
pipeline's wiring, every trace field its remaps read, and the mapping tables in
docs/siem.md are checked against offscope's own definitions instead."""

from __future__ import annotations

import re
import tomllib
from typing import Any, get_args, get_origin

import pytest
from pydantic import BaseModel

from offscope.trace.events import LlmEvent, OperatorEvent, Target, ToolCallEvent
from tests.support.deploy_testlib import DEPLOY, REPO

CONFIG = DEPLOY / "vector" / "vector.toml"
SIEM_DOC = REPO / "docs" / "siem.md"
RECORDS = {"tool_call": ToolCallEvent, "operator": OperatorEvent, "llm": LlmEvent}
# Component types the config may use (Vector's names).
KNOWN = {"sources": {"file"}, "transforms": {"remap", "filter"}, "sinks": {"http", "elasticsearch"}}


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
    assert _submodel(_fields(ToolCallEvent)["call"]).__name__ == "ToolCall"
    targets = _fields(_submodel(_fields(ToolCallEvent)["call"]))["targets"]
    assert get_origin(targets) is list and _submodel(targets) is Target
    assert not _resolves("call.no_such_field") and _resolves("call.targets.in_scope")
