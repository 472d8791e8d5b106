"""Mistyped keys and values in any file format get a suggestion, never pydantic's wording."""

from __future__ import annotations

from pathlib import Path

import pytest

from offscope.errors import InputError
from offscope.ledgers.model import Ledger
from offscope.policies.model import Policy
from offscope.yamlio import load_model

POLICY = """\
schema: offscope.policy/1
id: p
mode: enforse
on_eror: closed
operator: {reply: sentinal}
"""

LEDGER = """\
schema: offscope.ledger/1
id: l
targets:
  hosts: [a.test]
  recrods: ["customer:1"]
extract:
  - match: {host: a.test, pth: "/x/{id}"}
    targets: {record: "customer:{id}"}
"""


def _errors(model: type, text: str, tmp_path: Path) -> list[str]:
    f = tmp_path / "file.yaml"
    f.write_text(text)
    with pytest.raises(InputError) as exc:
        load_model(model, f)
    return str(exc.value).splitlines()


def test_policy_values_and_keys_are_suggested(tmp_path: Path) -> None:
    lines = _errors(Policy, POLICY, tmp_path)
    assert any(
        ":3: mode: 'enforse' is not one of" in x and "did you mean 'enforce'?" in x for x in lines
    )
    assert any(":5: operator.reply:" in x and "did you mean 'sentinel'?" in x for x in lines)
    assert any(":4: unknown key 'on_eror'; did you mean 'on_error'?" in x for x in lines)
    assert not any("Input should be" in x for x in lines)


def test_nested_keys_are_suggested_from_their_own_model(tmp_path: Path) -> None:
    lines = _errors(Ledger, LEDGER, tmp_path)
    assert any(":5:" in x and "did you mean 'records'?" in x for x in lines), lines
    # the match block's keys, not the ledger's top-level ones
    assert any(":7:" in x and "did you mean 'path'?" in x and "keys here:" in x for x in lines)


def test_no_suggestion_for_a_word_nothing_resembles(tmp_path: Path) -> None:
    lines = _errors(Policy, POLICY.replace("on_eror", "zzzzqqq"), tmp_path)
    (line,) = [x for x in lines if "zzzzqqq" in x]
    assert "did you mean" not in line and "keys here: " in line and "on_error" in line
