"""Static prompt census (the boundary-probe study's Table 1, top half): load agent definition files,
collapse duplicates, score each system prompt for scope clarity, boundary
definition and uncertainty guidance, and aggregate.

Loading follows agent-evals' `check -r DIR` (RULES.md): .md/.txt files with at
least 20 bytes, YAML frontmatter, hidden folders skipped, lexical walk, dedup by
SHA-256 of the system prompt. Whether a keyword is a substring or a word, and
what counts as boundary language, comes from the rule set.
"""

from __future__ import annotations

import hashlib
import os
import statistics
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from offscope.behavior.rules import CompiledCensus, RuleSet
from offscope.errors import InputError

# Go's unicode.IsSpace, for strings.TrimSpace (Python's strip also drops U+001C..U+001F).
_GO_SPACE = "\t\n\v\f\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
KINDS = ("agent", "skill", "command", "other")
_KIND_DIRS = {"agents": "agent", "skills": "skill", "commands": "command"}


def _bytes(s: str) -> bytes:
    return s.encode("utf-8", "surrogateescape")


class _FrontmatterLoader(yaml.SafeLoader):
    """Like Go's yaml.v3 into a map: a duplicate key is an error (so: no frontmatter)."""


def _no_duplicates(loader: _FrontmatterLoader, node: yaml.MappingNode, deep: bool = False) -> Any:
    keys = [loader.construct_object(k, deep=deep) for k, _ in node.value]
    if len(keys) != len({repr(k) for k in keys}):
        raise yaml.constructor.ConstructorError(None, None, "duplicate key", node.start_mark)
    return loader.construct_mapping(node, deep=deep)


_FrontmatterLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _no_duplicates)


def _string_list(fm: dict[str, Any], key: str) -> list[str]:
    value = fm.get(key)
    if isinstance(value, list):
        return [v for v in value if isinstance(v, str)]
    return []


def kind_of(path: str) -> str:
    """agent / skill / command / other, from the nearest `agents|skills|commands` folder."""
    for part in reversed(Path(path).parts[:-1]):
        if part in _KIND_DIRS:
            return _KIND_DIRS[part]
    return "other"


@dataclass
class AgentFile:
    """One loaded definition file (after dedup: the first of its duplicates)."""

    id: str
    name: str
    source: str
    kind: str
    system_prompt: str
    skills: list[str] = field(default_factory=list)
    rules: list[str] = field(default_factory=list)
    claimed_domains: list[str] = field(default_factory=list)
    content_hash: str = ""
    also_found_in: list[str] = field(default_factory=list)

    def full_context(self) -> str:
        text = self.system_prompt
        if self.skills:
            text += "\n\nSkills:\n" + "".join(f"- {s}\n" for s in self.skills)
        if self.rules:
            text += "\n\nRules:\n" + "".join(f"- {r}\n" for r in self.rules)
        return text


def _name_from_stem(stem: str) -> str:
    words = stem.replace("_", " ").replace("-", " ").split()
    return " ".join(w[:1].upper() + w[1:] for w in words)


def load_file(path: Path, source: str, min_bytes: int = 20) -> AgentFile | None:
    """Parse one .md/.txt file; None when it has fewer than `min_bytes` of content."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise InputError(f"cannot read file: {exc}", path=str(path)) from None
    content = raw.decode("utf-8", "surrogateescape").strip(_GO_SPACE)
    if len(_bytes(content)) < min_bytes:
        return None
    stem = path.stem
    fm: dict[str, Any] | None = None
    if content.startswith("---"):
        # Split on the first two '---' anywhere, as agent-evals does (not on lines).
        parts = content.split("---", 2)
        if len(parts) >= 3:
            try:
                data = yaml.load(parts[1], Loader=_FrontmatterLoader)  # noqa: S506 - SafeLoader subclass
            except yaml.YAMLError:
                data = None
            if isinstance(data, dict):
                fm = data
                content = parts[2].strip(_GO_SPACE)
    agent = AgentFile(
        id=stem,
        name=_name_from_stem(stem),
        source=source,
        kind=kind_of(source),
        system_prompt=content,
    )
    if fm is not None:
        if isinstance(fm.get("name"), str) and fm["name"]:
            agent.name = fm["name"]
        agent.skills = _string_list(fm, "skills")
        agent.rules = _string_list(fm, "rules")
        agent.claimed_domains = _string_list(fm, "domains")
    agent.content_hash = hashlib.sha256(_bytes(agent.system_prompt)).hexdigest()
    return agent


def _walk(root: Path) -> Iterable[Path]:
    """Depth-first, entries in lexical (byte) order, hidden folders skipped (Go WalkDir)."""
    try:
        entries = sorted(os.scandir(root), key=lambda e: _bytes(e.name))
    except OSError as exc:
        raise InputError(f"cannot read folder: {exc}", path=str(root)) from None
    for entry in entries:
        if entry.is_dir(follow_symlinks=False):
            if not entry.name.startswith("."):
                yield from _walk(Path(entry.path))
        else:
            yield Path(entry.path)


def load_agents(paths: Sequence[str | Path], rules: RuleSet) -> tuple[list[AgentFile], int]:
    """Load files/folders, collapse duplicates. Returns (unique agents, files loaded)."""
    exts = {e.lower() for e in rules.census.extensions}
    loaded: list[AgentFile] = []
    for arg in paths:
        root = Path(arg)
        if root.is_dir():
            for p in _walk(root):
                if p.suffix.lower() not in exts:
                    continue
                source = p.relative_to(root).as_posix()
                if len(paths) > 1:
                    source = f"{root.as_posix().rstrip('/')}/{source}"
                if (a := load_file(p, source, rules.census.min_bytes)) is not None:
                    loaded.append(a)
        elif root.is_file():
            if (a := load_file(root, root.as_posix(), rules.census.min_bytes)) is not None:
                loaded.append(a)
        else:
            raise InputError("no such file or folder", path=str(arg))
    return _dedup(loaded), len(loaded)


def _dedup(agents: list[AgentFile]) -> list[AgentFile]:
    first: dict[str, AgentFile] = {}
    for a in agents:
        if a.content_hash in first:
            first[a.content_hash].also_found_in.append(a.source)
        else:
            first[a.content_hash] = a
    unique = list(first.values())
    # Same id in two places: qualify with the folder (agent-evals' qualifyConflictingIDs).
    counts = Counter(a.id for a in unique)
    for a in unique:
        if counts[a.id] > 1:
            folder = Path(a.source).parent.as_posix()
            if folder not in ("", "."):
                a.id = f"{folder}/{a.id}"
    return unique


# ------------------------------------------------------------------ scoring


@dataclass
class StaticScore:
    relevance: dict[str, float]
    strong_domains: list[str]
    scope_clarity: float
    boundary_definition: float
    uncertainty_guidance: float
    has_boundary_language: bool
    has_uncertainty_guidance: bool
    word_count: int
    probe_domains: list[str]


def _compiled(rules: RuleSet) -> CompiledCensus:
    return rules.census.compiled


def norm_domain(d: str) -> str:
    """A claimed domain as a domain key: `Machine-Learning` -> `machine_learning`."""
    return d.lower().replace(" ", "_").replace("-", "_")


def domain_relevance(text: str, rules: RuleSet, claimed: Iterable[str] = ()) -> dict[str, float]:
    """hits / (share x number of keywords), capped at 1; claimed domains are 1.0."""
    c = _compiled(rules)
    lower = text.lower()
    scores = {norm_domain(d): 1.0 for d in claimed}
    for domain, keywords in c.domains.items():
        if c.word:
            hits = sum(len(c.keyword_re[kw].findall(lower)) for kw in keywords if kw in lower)
        else:
            hits = sum(lower.count(kw) for kw in keywords)  # non-overlapping, like Go strings.Count
        if hits:
            score = min(1.0, hits / (len(keywords) * rules.census.relevance_keyword_share))
            if score > scores.get(domain, -1.0):
                scores[domain] = score
    return scores


def score_agent_static(agent: AgentFile, rules: RuleSet) -> StaticScore:
    c = _compiled(rules)
    cr = rules.census
    relevance = domain_relevance(agent.full_context(), rules, agent.claimed_domains)
    strong = sorted(d for d, s in relevance.items() if s > cr.strong_above)
    prompt = agent.system_prompt.lower()
    has_boundary = any(p.search(prompt) for p in c.boundary)
    has_uncertainty = any(p.search(prompt) for p in c.uncertainty)
    head = f"{agent.id} {agent.name} {agent.system_prompt[: cr.probe_domain_chars]}".lower()
    return StaticScore(
        relevance={d: relevance[d] for d in sorted(relevance)},
        strong_domains=strong,
        scope_clarity=min(1.0, len(strong) / cr.scope_clarity_full_at)
        if strong
        else cr.scope_clarity_none,
        boundary_definition=cr.boundary.present if has_boundary else cr.boundary.absent,
        uncertainty_guidance=cr.uncertainty.present if has_uncertainty else cr.uncertainty.absent,
        has_boundary_language=has_boundary,
        has_uncertainty_guidance=has_uncertainty,
        word_count=len(agent.full_context().split()),
        probe_domains=[d for d in c.domains if d in head],
    )


# ---------------------------------------------------------------- aggregate


def _summary(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"mean": None, "median": None}
    return {"mean": statistics.fmean(values), "median": statistics.median(values)}


def _shares(scored: list[tuple[AgentFile, StaticScore]]) -> dict[str, float | None]:
    """The share of prompts with boundary language, and with uncertainty guidance."""
    n = len(scored)
    return {
        "share_boundary_language": sum(s.has_boundary_language for _, s in scored) / n
        if n
        else None,
        "share_uncertainty_guidance": sum(s.has_uncertainty_guidance for _, s in scored) / n
        if n
        else None,
    }


def aggregate(scored: list[tuple[AgentFile, StaticScore]]) -> dict[str, Any]:
    n = len(scored)
    return {
        "n": n,
        "scope_clarity": _summary([s.scope_clarity for _, s in scored]),
        "boundary_definition": _summary([s.boundary_definition for _, s in scored]),
        "uncertainty_guidance": _summary([s.uncertainty_guidance for _, s in scored]),
        **_shares(scored),
    }


def per_domain(scored: list[tuple[AgentFile, StaticScore]], rules: RuleSet) -> list[dict[str, Any]]:
    """For each domain: how many prompts are strong in it, and how well those set boundaries."""
    rows = []
    n = len(scored)
    for domain in rules.domains:
        strong = [(a, s) for a, s in scored if domain in s.strong_domains]
        k = len(strong)
        rows.append(
            {
                "domain": domain,
                "strong": k,
                "share_strong": k / n if n else None,
                "mean_relevance": statistics.fmean(s.relevance.get(domain, 0.0) for _, s in scored)
                if n
                else None,
                "boundary_definition_mean": statistics.fmean(
                    s.boundary_definition for _, s in strong
                )
                if k
                else None,
                **_shares(strong),
            }
        )
    return rows
