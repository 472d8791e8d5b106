"""How well a rule set's "boundary language" finds prompts that limit the agent's own scope.

The census calls a prompt boundary-setting when one of the rule set's `census.boundary`
patterns matches. That is a classifier; this module measures it against hand labels
(`data/census-labels.jsonl`, guide and sampling in `data/census-labels.md`) of the
bundled wshobson/agents corpus:

- draw `random`: a seeded simple random sample of the corpus's unique prompts
  (`random.Random(SEED).sample(range(N), SIZE)` over the loader's order), split in two
  halves by `random.Random(SEED + 1)`: `dev` (used to revise the offscope patterns) and
  `test` (held out). Precision, recall and the labelled share are computed on the random
  draw only, so they are unweighted estimates for the corpus.
- draws `flagged-offscope-v1` / `flagged-offscope`: every prompt the original / the
  revised offscope patterns flag outside the earlier draws. They make precision over
  everything the offscope rules flag a count; they never enter recall or the share.

The figures are computed from the corpus (which the package does not ship) and stored in
`data/census-validation.json`, keyed by a fingerprint of the boundary patterns; a test
recomputes them so the file cannot go stale. Regenerate with
`python -m offscope.probes.census_validation tests/data/census-wshobson-agents-2026-02/plugins`.
"""

from __future__ import annotations

import hashlib
import json
import random
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from offscope.behavior.rules import BUILTIN, RuleSet, load_rules
from offscope.errors import InputError
from offscope.probes.census import AgentFile, load_agents, score_agent_static
from offscope.trace.rates import Rate

DATA = Path(__file__).resolve().parent / "data"  # the hand labels and the stored figures
LABELS = DATA / "census-labels.jsonl"
VALIDATION = DATA / "census-validation.json"
SEED = 14
SIZE = 160
CORPUS_NAME = "wshobson/agents plugins/ at 5d65aa1 (tests/data/census-wshobson-agents-2026-02)"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LabelItem(_Strict):
    """One hand-labelled prompt: does it limit the agent's own scope?"""

    source: str = Field(description="path relative to the corpus's plugins/ folder")
    content_hash: str = Field(pattern=r"^[0-9a-f]{64}$", description="sha256 of the system prompt")
    kind: Literal["agent", "skill", "command", "other"]
    draw: Literal["random", "flagged-offscope-v1", "flagged-offscope"]
    split: Literal["dev", "test", "fresh"] = Field(
        description="dev: seen while revising the offscope patterns; test: held out; "
        "fresh: labelled after the revision was fixed"
    )
    label: bool
    reason: str = Field(min_length=3)


class Counts(_Strict):
    tp: int = Field(ge=0)
    fp: int = Field(ge=0)
    fn: int = Field(ge=0)
    tn: int = Field(ge=0)


class RuleFigures(_Strict):
    fingerprint: str
    random: Counts = Field(description="the whole random draw")
    test: Counts = Field(description="its held-out half")
    fresh: Counts | None = Field(
        None,
        description="offscope only: prompts it flags outside the earlier "
        "draws, labelled after its revision was fixed (read precision only)",
    )
    all_flagged_labelled: int | None = Field(
        None, description="flagged prompts labelled (all of them)"
    )
    all_flagged_positive: int | None = None


class ValidationFile(_Strict):
    schema_: Literal["offscope.census-validation/1"] = Field(alias="schema")
    labels_sha256: str
    corpus: str
    seed: int
    population: int
    random_n: int
    rule_sets: dict[str, RuleFigures]


# ------------------------------------------------------------------ metrics


@dataclass(frozen=True)
class Confusion:
    """A 2x2 table: rule flagged (or not) x labelled as limiting scope (or not)."""

    tp: int
    fp: int
    fn: int
    tn: int

    @classmethod
    def of(cls, labels: Iterable[bool], flagged: Iterable[bool]) -> Confusion:
        pairs = list(zip(labels, flagged, strict=True))
        return cls(
            tp=sum(y and f for y, f in pairs),
            fp=sum(f and not y for y, f in pairs),
            fn=sum(y and not f for y, f in pairs),
            tn=sum(not y and not f for y, f in pairs),
        )

    @property
    def n(self) -> int:
        return self.tp + self.fp + self.fn + self.tn

    @property
    def precision(self) -> Rate:
        """Of the prompts the rule flags, the share that limit their own scope."""
        return Rate(self.tp, self.tp + self.fp)

    @property
    def recall(self) -> Rate:
        """Of the prompts that limit their own scope, the share the rule flags."""
        return Rate(self.tp, self.tp + self.fn)

    @property
    def labelled_share(self) -> Rate:
        return Rate(self.tp + self.fn, self.n)

    @property
    def flagged_share(self) -> Rate:
        return Rate(self.tp + self.fp, self.n)

    @property
    def f1(self) -> float | None:
        p, r = self.precision.value, self.recall.value
        if p is None or r is None or p + r == 0:
            return None
        return 2 * p * r / (p + r)


# ------------------------------------------------------------------ files


def fingerprint(rules: RuleSet) -> str:
    """Identifies the boundary classifier: its patterns and regex flavour, nothing else."""
    spec = {"patterns": list(rules.census.boundary.patterns), "ascii": rules.census.ascii}
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()


def load_labels(path: str | Path = LABELS) -> list[LabelItem]:
    """Read the labels file; a bad line is an InputError naming the file and line."""
    items: list[LabelItem] = []
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise InputError(f"cannot read labels: {exc}", path=str(path)) from None
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            items.append(LabelItem.model_validate_json(line))
        except ValidationError as exc:
            err = exc.errors()[0]
            where = ".".join(str(p) for p in err["loc"]) or "line"
            raise InputError(
                f"{where}: {err['msg']}",
                path=str(path),
                line=lineno,
                hint="one JSON object per line with source, content_hash, kind, draw, label, reason",
            ) from None
    return items


def draw_random(agents: Sequence[AgentFile], seed: int = SEED, size: int = SIZE) -> list[AgentFile]:
    """The seeded simple random sample the labels' `random` draw was taken from."""
    return [agents[i] for i in random.Random(seed).sample(range(len(agents)), size)]


def held_out(size: int = SIZE, seed: int = SEED) -> set[int]:
    """Positions in the random draw of its held-out (`test`) half."""
    return set(random.Random(seed + 1).sample(range(size), size // 2))


def match_corpus(labels: Sequence[LabelItem], agents: Sequence[AgentFile]) -> list[AgentFile]:
    """The corpus prompt of each label, by content hash; a missing or changed prompt is an error."""
    by_hash = {a.content_hash: a for a in agents}
    out = []
    for i, item in enumerate(labels, 1):
        agent = by_hash.get(item.content_hash)
        if agent is None or agent.source != item.source:
            raise InputError(
                f"label {i} ({item.source}) does not match the corpus",
                path=str(LABELS),
                line=i,
                hint="the prompt changed or is not in the corpus: relabel it",
            )
        out.append(agent)
    return out


def evaluate(
    rules: RuleSet, labels: Sequence[LabelItem], agents: Sequence[AgentFile]
) -> RuleFigures:
    """The rule set's confusion table on the random draw and its precision on all it flags."""
    prompts = match_corpus(labels, agents)
    flagged = [score_agent_static(a, rules).has_boundary_language for a in prompts]

    def table(splits: set[str], draws: tuple[str, ...] = ("random",)) -> Counts:
        pairs = [
            (item.label, f)
            for item, f in zip(labels, flagged, strict=True)
            if item.draw in draws and item.split in splits
        ]
        c = Confusion.of([y for y, _ in pairs], [f for _, f in pairs])
        return Counts(tp=c.tp, fp=c.fp, fn=c.fn, tn=c.tn)

    labelled = {item.content_hash: item.label for item in labels}
    all_flagged = [a for a in agents if score_agent_static(a, rules).has_boundary_language]
    complete = all(a.content_hash in labelled for a in all_flagged)
    return RuleFigures(
        fingerprint=fingerprint(rules),
        random=table({"dev", "test"}),
        test=table({"test"}),
        # The fresh draw was chosen by the offscope patterns: a precision check for them only.
        fresh=table({"fresh"}, ("flagged-offscope",)) if rules.name == "offscope" else None,
        all_flagged_labelled=len(all_flagged) if complete else None,
        all_flagged_positive=sum(labelled[a.content_hash] for a in all_flagged)
        if complete
        else None,
    )


def build(corpus: str | Path, labels_path: str | Path = LABELS) -> ValidationFile:
    labels = load_labels(labels_path)
    agents, _ = load_agents([corpus], load_rules("agent-evals"))
    return ValidationFile(
        schema="offscope.census-validation/1",
        labels_sha256=hashlib.sha256(Path(labels_path).read_bytes()).hexdigest(),
        corpus=CORPUS_NAME,
        seed=SEED,
        population=len(agents),
        random_n=sum(item.draw == "random" for item in labels),
        rule_sets={name: evaluate(load_rules(name), labels, agents) for name in BUILTIN},
    )


@cache
def stored() -> ValidationFile:
    return ValidationFile.model_validate_json(VALIDATION.read_text(encoding="utf-8"))


# ------------------------------------------------------------------ report


def _scores(counts: Counts) -> dict[str, Any]:
    c = Confusion(**counts.model_dump())
    return {
        "confusion": counts.model_dump(),
        "precision": c.precision.as_dict(),
        "recall": c.recall.as_dict(),
        "f1": c.f1,
        "flagged_share": c.flagged_share.as_dict(),
    }


def _rule_block(figures: RuleFigures) -> dict[str, Any]:
    block: dict[str, Any] = {
        "held_out": _scores(figures.test),
        "random_draw": _scores(figures.random),
    }
    if figures.fresh is not None and figures.fresh.tp + figures.fresh.fp:
        block["precision_fresh"] = Confusion(**figures.fresh.model_dump()).precision.as_dict()
    if figures.all_flagged_labelled is not None and figures.all_flagged_positive is not None:
        block["precision_all_flagged"] = Rate(
            figures.all_flagged_positive, figures.all_flagged_labelled
        ).as_dict()
    return block


def boundary_validation(rules: RuleSet) -> dict[str, Any]:
    """The report's `boundary_validation` block: this rule set's figures (if its patterns
    were validated) next to every built-in rule set's, on the same labelled sample."""
    v = stored()
    fp = fingerprint(rules)
    first = next(iter(v.rule_sets.values()))
    share = Confusion(**first.random.model_dump()).labelled_share
    validated_as = next((name for name, f in v.rule_sets.items() if f.fingerprint == fp), None)
    return {
        "question": "does the prompt limit the agent's own scope?",
        "sample": f"{v.random_n} of {v.population} unique prompts of {v.corpus}, "
        f"simple random sample (seed {v.seed}), labelled by hand",
        "held_out": f"{v.random_n // 2} of them (seed {v.seed + 1}), not used to write the offscope patterns",
        "labelled_share": share.as_dict(),
        "validated": validated_as is not None,
        "validated_as": validated_as,
        "rule_sets": {name: _rule_block(f) for name, f in v.rule_sets.items()},
    }


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m offscope.probes.census_validation CORPUS/plugins", file=sys.stderr)
        return 2
    v = build(args[0])
    VALIDATION.write_text(v.model_dump_json(by_alias=True, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {VALIDATION}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
