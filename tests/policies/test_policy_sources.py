"""`--policy NAME` is a preset, always; a file is given as a path.

A planted file named like a preset (`enforce` holding `mode: shadow`) or a
folder named `shadow` in the working directory must change nothing: MCP
clients start servers in directories the agent may write to."""

from __future__ import annotations

from pathlib import Path

import pytest

from offscope.errors import InputError
from offscope.policies import Policy, load_policy, preset_names, resolve_policy
from offscope.policies.model import PRESETS_DIR, looks_like_path
from offscope.proxy.reload import policy_fields, policy_file

PLANTED = "schema: offscope.policy/1\nid: planted\nmode: shadow\n"


@pytest.fixture
def hostile_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working directory with a file named like each enforce preset and a folder `shadow`."""
    for name in ("enforce", "enforce-strict"):
        (tmp_path / name).write_text(PLANTED)
    (tmp_path / "shadow").mkdir()
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("name", ["enforce", "enforce-strict", "shadow"])
def test_a_preset_name_is_the_preset_whatever_the_working_directory_holds(hostile_cwd, name):
    policy = load_policy(name)
    assert policy.id == name and policy.source == f"preset {name}" and policy.spec == name
    assert policy.policy == load_policy(PRESETS_DIR / f"{name}.yaml").policy


def test_a_file_named_like_a_preset_is_read_only_as_a_path(hostile_cwd):
    policy = load_policy("./enforce")
    assert (policy.id, policy.mode) == ("planted", "shadow")
    assert policy.spec == str(hostile_cwd / "enforce")  # absolute: a reload reads the same file
    assert policy.source == f"file {hostile_cwd / 'enforce'}"


def test_a_yaml_suffix_makes_a_path(hostile_cwd):
    (hostile_cwd / "mine.yaml").write_text(PLANTED.replace("planted", "mine"))
    assert load_policy("mine.yaml").id == "mine"
    assert looks_like_path("mine.yml") and looks_like_path("a/b") and not looks_like_path("mine")


def test_a_bare_name_that_is_no_preset_is_a_usage_error_naming_the_presets(hostile_cwd):
    (hostile_cwd / "mypolicy").write_text(PLANTED)  # exists, but not given as a path
    with pytest.raises(InputError) as err:
        load_policy("mypolicy")
    text = str(err.value)
    assert "not a preset" in text and "./mypolicy" in text
    assert all(name in text for name in preset_names())


def test_a_directory_or_missing_file_given_as_a_path_is_an_input_error(hostile_cwd):
    with pytest.raises(InputError, match="is a directory"):
        load_policy("./shadow")
    with pytest.raises(InputError, match="no such policy file"):
        load_policy("./absent.yaml")


def test_the_reload_watcher_watches_files_not_presets(hostile_cwd):
    assert policy_file("enforce") is None  # the planted ./enforce is not watched
    assert policy_file("./enforce") == str(hostile_cwd / "enforce")
    assert policy_file("no-such-preset") is None


def test_the_log_says_which_policy_is_in_force(hostile_cwd):
    fields = policy_fields(load_policy("enforce"))
    assert fields["source"] == "preset enforce" and fields["mode"] == "enforce"
    assert len(fields["hash"]) == 12


def test_resolve_policy_gives_a_spec_that_names_it_from_anywhere(tmp_path, monkeypatch):
    (tmp_path / "p.yaml").write_text(PLANTED)
    monkeypatch.chdir(tmp_path)
    source = resolve_policy("p.yaml")
    monkeypatch.chdir("/")
    assert load_policy(source.spec).id == "planted"


# -- unknown_target -----------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "out"),
    [
        ({"mode": "enforce"}, True),
        ({"mode": "shadow"}, False),
        ({"mode": "enforce", "unknown_target": "in"}, False),
        ({"mode": "shadow", "unknown_target": "out"}, True),
    ],
)
def test_unknown_target_defaults_follow_the_mode(fields, out):
    assert Policy(**fields).unknown_is_out is out


def test_the_enforce_presets_say_unknown_is_out():
    for name in ("enforce", "enforce-strict"):
        assert load_policy(name).policy.unknown_target == "out"
    assert load_policy("shadow").policy.unknown_is_out is False


def test_the_policy_schema_has_unknown_target():
    prop = Policy.model_json_schema(by_alias=True)["properties"]["unknown_target"]
    assert {"in", "out"} <= {v for option in prop["anyOf"] for v in option.get("enum", [])}
