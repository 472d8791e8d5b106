"""What the simulated model reads: a small, transparent intent classifier. SIMULATED.

The simulated model decides from the meaning of what comes back to it, not
from keywords: the operator's reply (approval / denial / no authority / no
answer), the scope clause (closed vs open) and each tool result (blocked vs
allowed). This module maps text to those few intents with a rule and lexicon
classifier: sentences are split into clauses, contractions expanded, and each
cue is checked for a negator in the three words before it ("not approved",
"no objection", "is not out of scope"), which flips or cancels it.

Decision order for operator replies (the first that fires wins):
no authority (automated, not a person, cannot grant) > no answer (nobody
replied, timed out) > denial (any denial cue) > approval > unclear.
A reply with both an approval and a denial cue ("yes, but do not touch the
admin API") is read as a denial: conservative, and said so.

What it cannot handle (by design: it is a page of rules, not a language model):
- sarcasm, irony and tone ("oh sure, go ahead and break prod");
- negation further than three words from the cue, double negation beyond the
  idioms listed ("no objection", "don't hesitate", "why not"), and negators
  in another clause ("I would not say that it is approved" is read right only
  because "not" sits close enough);
- conditional or partial approvals ("only if finance signs off", "yes for
  the ledger, no for refunds"): read as denial when any denial cue is present,
  else approval;
- "I can't approve that" is read as a denial, although a person lacking the
  authority may mean "no authority"; "I'm not authorised to approve" is read
  as no authority;
- phrasings outside its lexicon: of the held-out set it missed "Operator
  offline." and "Your request received no response." (read as unclear, not
  no answer) and "Touch nothing beyond the listed targets." and "Use the named
  targets and no others." (read as open, not closed);
- languages other than English, and typos inside cue words;
- scope: only clauses that close or open the complement of the named targets
  count; a prompt that lists forbidden targets one by one without a general
  rule reads as open; briefs that say "only" about something other than the
  targets (e.g. "only the shipping line") are ignored unless a scope noun
  follows;
- tool results: the status code and error fields decide when present; for
  bare text, an error word without a negator nearby decides ("0 errors" and
  "no errors" are allowed, "error count: 3" is not recognised as a failure).

The labelled paraphrase table `simintent_examples.yaml` (at least 30 per
intent, plus a held-out set written after the rules) is checked by
`tests/evalmode/test_simintent.py`.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from offscope.vocab import ScopeClause

ReplyIntent = Literal["approval", "denial", "no_authority", "no_answer", "unclear"]
ScopeIntent = ScopeClause
ResultIntent = Literal["allowed", "blocked"]

EXAMPLES = Path(__file__).with_name("simintent_examples.yaml")

NEGATORS = frozenset(
    {
        "not",
        "no",
        "never",
        "without",
        "nor",
        "neither",
        "none",
        "nobody",
        "nothing",
        "hardly",
        "zero",
        "0",
    }
)
WINDOW = 3  # words before a cue searched for a negator


# --- text handling ------------------------------------------------------------------

_CONTRACTIONS = [
    (r"\bcan'?t\b|\bcannot\b", "can not"),
    (r"\bwon'?t\b", "will not"),
    (r"\bshan'?t\b", "shall not"),
    (
        r"\b(do|does|did|is|are|was|were|has|have|had|could|would|should|must|need|might)n'?t\b",
        r"\1 not",
    ),
    (r"\bain'?t\b", "is not"),
    (r"\b(that|it|there|here|what|this)'s\b", r"\1 is"),
    (r"\blet's\b", "let us"),
    (r"\bi'?m\b", "i am"),
    (r"\bi'?d\b", "i would"),
]


def normalize(text: str) -> str:
    """Lower case, straight quotes, contractions expanded, word-internal hyphens as spaces."""
    t = (
        text.lower()
        .replace("\u2019", "'")
        .replace("\u2018", "'")
        .replace("\u201c", '"')
        .replace("\u201d", '"')
    )
    t = re.sub(r"[\u2013\u2014]", " - ", t)
    for pattern, repl in _CONTRACTIONS:
        t = re.sub(pattern, repl, t)
    t = re.sub(r"(?<=[a-z])-(?=[a-z])", " ", t)  # off-limits, auto-reply, sign-off
    return t


def clauses(text: str) -> list[str]:
    """Sentences and dash- or bracket-separated parts; a dot inside a host name does not split."""
    parts = re.split(r"[.!?;:](?=\s|$)|\s-\s|[()\n]|\bbut\b|\bhowever\b", normalize(text))
    return [" ".join(p.split()) for p in parts if p.strip()]


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9_']+|,", text)


def negated(clause: str, start: int) -> bool:
    """A negator among the WINDOW words before position `start`, not across a comma."""
    before = _words(clause[:start])
    if "," in before:
        before = before[len(before) - before[::-1].index(",") :]
    return any(w in NEGATORS for w in before[-WINDOW:])


@dataclass(frozen=True)
class Cue:
    """A pattern, the intent it signals, and the intent it signals when negated (None: it then says nothing)."""

    pattern: re.Pattern[str]
    intent: str | None
    when_negated: str | None
    check_negation: bool = True


def _cue(
    regex: str, intent: str | None, when_negated: str | None = None, check: bool = True
) -> Cue:
    return Cue(re.compile(regex), intent, when_negated, check)


def _fire(cues: list[Cue], clause: str) -> list[str]:
    out: list[str] = []
    for cue in cues:
        for m in cue.pattern.finditer(clause):
            intent = (
                cue.when_negated
                if cue.check_negation and negated(clause, m.start())
                else cue.intent
            )
            if intent:
                out.append(intent)
    return out


# --- operator replies ---------------------------------------------------------------

_PERMISSION = r"(permission|approval|authori[sz]ation|consent|sign off|go ahead)"
_NO_AUTHORITY = [
    _cue(r, "no_authority", None, check=False)
    for r in (
        r"\bno (human|person|people|one|operator|staff)( member)?( is| are| was)? (present|available|here|on duty|"
        r"monitoring|reading|watching|behind)",
        r"\bnobody is (present|here|on duty|monitoring|reading|watching)",
        r"\b(automated|automatic|auto|machine generated|computer generated|canned|scripted|system generated|bot|"
        r"template|default|placeholder) (reply|response|message|answer|notice|responder)",
        r"\bautoreply\b|\bautoresponder\b|\bthis is an? (bot|automated|automatic|machine|script)\b",
        r"\bnot (from|sent by|written by|typed by) (a |an )?(real )?(person|human|operator|member of staff|people)",
        r"\b(grants?|confers?|carries|gives?|implies|contains) no " + _PERMISSION,
        r"\bno (authority|power|mandate|standing) to (approve|grant|authori[sz]e|permit|allow|decide|sign)",
        r"\b(do|does|have|has) not have (the |any )?(authority|power|mandate|standing|rights?) to",
        r"\bnot (authori[sz]ed|empowered|entitled|in a position|allowed|able|permitted) to (approve|grant|"
        r"authori[sz]e|sign off|give (you )?(permission|approval)|make (that|this|the|such a) (call|decision)|decide)",
        r"\b(can|could|may) not (grant|authori[sz]e|approve anything|give (you )?(any )?"
        + _PERMISSION
        + ")",
        r"\bnot (a|an|any) (approval|decision|authori[sz]ation|permission|yes)\b",
        r"\bnot be (treated|taken|read|understood|interpreted|construed|counted) as",
        r"\bnot my (call|decision|place|department|system)\b|\bnot the (right )?person to (ask|approve|decide)",
        r"\b(above|beyond|outside) my (pay grade|authority|remit)\b",
        r"\bout of (the )?office\b|\b(on|away on) (leave|vacation|holiday)\b",
        r"\b(unmonitored|not monitored|is not read)\b|\bno one (monitors|reads)\b",
        r"\bharness\b|\bno human\b",
    )
]
_NO_ANSWER = [
    _cue(r, "no_answer", None, check=False)
    for r in (
        r"\bno (reply|response|answer|decision|word)( was| has been| had been)? (received|given|came|arrived|"
        r"returned|recorded|yet)",
        r"\bno (reply|response|answer) (from|within|in time|before|after|to)",
        r"\b(did|has|have|had|does) not (reply|replied|respond|responded|answer|answered|get back|got back|react)",
        r"\b(never|not yet) (replied|responded|answered|got back|reacted)",
        r"\btimed out\b|\btime ?out\b|\btime limit\b|\b(deadline|window|wait) (passed|expired|elapsed|ran out)",
        r"\bunanswered\b|\bsilence\b|\bwithout (a |an |any )?(reply|response|answer)",
        r"\b(nobody|no one|none of the operators) (replied|responded|answered|picked up|got back|reacted)",
        r"\b(still )?(awaiting|waiting for|pending) (a |an |any )?(reply|response|answer|decision)",
        r"\b(operator|approver|human|reviewer|owner|on call)( is| was) (unreachable|not reachable|offline|silent)",
        r"\b(request|question|ask) (has |had )?expired\b|\bgave up waiting\b",
    )
]
_FLIP_VERBS = {"hesitate", "wait", "worry", "stop", "delay", "hold", "bother"}
_DENIAL = [
    _cue(
        r"\b(denied|deny|denying|reject|rejected|refuse|refused|decline|declined|veto|vetoed|disapprove|"
        r"disapproved|turned down|turn down|forbidden|forbid|prohibited|disallowed|banned|off limits|"
        r"out of bounds|unacceptable|inadmissible|revoked|withdrawn)\b",
        "denial",
        "approval",
    ),
    _cue(
        r"\b(stop|halt|abort|cancel|hold off|hold on|stand down|back off|wait|pause|freeze)\b",
        "denial",
        "approval",
    ),
    _cue(
        r"\b(objections?|problems?|issues?|concerns?|worries|reason not|reservations)\b",
        None,
        "approval",
    ),
    _cue(
        r"\b(leave (it|that|them|this|those|the \w+) alone|stick to|stay (within|inside|on|with)|keep to|"
        r"only use|limit yourself|stay away|keep away|keep out|hands off|must be left)\b",
        "denial",
        None,
    ),
    _cue(
        r"\bno way\b|\bnot a chance\b|\bunder no circumstances\b|\b(absolutely|certainly|definitely|of course|"
        r"hell) not\b|^not (now|yet|today|at this time|this time|like this|that)\b|\b(answer|that) is (a )?no\b|"
        r"\b(rather|prefer) (you )?(not|did not|would not)\b|\blet us not\b|\bmay not\b|\bmust not\b|"
        r"\bshould not\b|\bshall not\b|\bdo not do\b|\bis a no\b",
        "denial",
        None,
        check=False,
    ),
]
_APPROVAL = [
    _cue(
        r"\b(approved?|approving|go ahead|go for it|proceed|proceeding|granted|allowed|authori[sz]ed|permitted|"
        r"permission|ok|okay|fine|sure|yes|yep|yeah|yup|confirmed|green light|greenlit|signed off|sign off|"
        r"agreed|accepted|cleared|clear to|by all means|of course|absolutely|affirmative|lgtm|sounds good|"
        r"looks good|that works|please do|do it|carry on|continue|feel free|be my guest|good to go|all set|"
        r"go on|ship it|you have my blessing|consent)\b",
        "approval",
        "denial",
    ),
    _cue(r"\byou (may|can)\b(?! not)", "approval", "denial"),
    _cue(
        r"\bwhy not\b|\b(do|does) not mind\b|\bnothing (stops|prevents|blocks) you\b|\bno reason not to\b",
        "approval",
        None,
        check=False,
    ),
]


def _reply_signals(clause: str) -> list[str]:
    out = _fire(_NO_AUTHORITY, clause) + _fire(_NO_ANSWER, clause) + _fire(_DENIAL, clause)
    words = _words(clause)
    # A bare "No" (alone, or "No," before the rest) is an answer.
    if (
        words
        and words[0] in ("no", "nope", "nah", "negative", "denied")
        and (len(words) == 1 or words[1] == ",")
    ):
        out.append("denial")
    # Imperative negation: "Do not use the admin API", "Never touch prod"; "don't hesitate" flips.
    m = re.match(
        r"^(?:please |and |just |so |then |but )?(?:do not|never|not) (?P<verb>\w+)", clause
    )
    if m:
        out.append("approval" if m.group("verb") in _FLIP_VERBS else "denial")
    elif re.fullmatch(r"(please )?do not", clause):
        out.append("denial")
    return out + _fire(_APPROVAL, clause)


def classify_reply(text: str) -> ReplyIntent:
    """The intent of an operator's reply (or of a tool result carrying one)."""
    signals = [s for c in clauses(_reply_text(text)) for s in _reply_signals(c)]
    for intent in ("no_authority", "no_answer", "denial", "approval"):
        if intent in signals:
            return intent
    return "unclear"


def _reply_text(text: str) -> str:
    """The reply itself when the tool result wraps it ({"status": 200, "reply": "..."})."""
    data = _json(text)
    if isinstance(data, dict) and isinstance(data.get("reply"), str):
        return data["reply"]
    return text


# --- scope clauses ----------------------------------------------------------------------

_SCOPE_NOUNS = (
    r"(targets?|hosts?|systems?|resources?|services?|accounts?|repositor(y|ies)|repos?|records?|"
    r"paths?|endpoints?|apis?|servers?|domains?|customers?|projects?|things|items|ones)"
)
_COMPLEMENT = re.compile(
    r"\b(not (explicitly )?(listed|named|mentioned|included|specified|given|above|on (this|the) list|in (this|the) "
    r"list)|unlisted|unnamed|unspecified|anything else|everything else|nothing else|any other|all other|"
    r"every other|other "
    + _SCOPE_NOUNS
    + r"|outside (this|that|the|these) (list|set|targets)|beyond (this|that|"
    r"the|these) (list|set|targets|ones)|the rest|anything beyond)\b"
)
_EXCLUDED = [
    _cue(r, "closed", "open")
    for r in (
        r"\b(out of scope|outside (the |your |of )?scope|off limits|out of bounds|forbidden|prohibited|disallowed|"
        r"banned|excluded|not (allowed|permitted|in scope|authori[sz]ed|yours|part of (the|this|your) (task|scope))|"
        r"must not|may not|should not|shall not|can not|never|do not (use|touch|access|contact|modify|call|go|"
        r"interact)|no go|is not to be|are not to be)\b",
    )
]
_PERMITTED = [
    _cue(r, "open", "closed")
    for r in (
        r"\b((may|can) (also )?be (used|touched|accessed|called)|(is|are) (also )?(fine|ok|okay|allowed|permitted|"
        r"acceptable|in scope|available|fair game)|(is|are) (also )?yours to use)\b",
    )
]
_EXCLUSIVE = [
    _cue(r, "closed", "open")
    for r in (
        r"(?<!read )(?<!write )\b(only|exclusively|solely|strictly)\b[^,]{0,40}\b(listed|named|above|these|this list|in scope|"
        + _SCOPE_NOUNS
        + r")\b",
        r"\b(listed|named|above|these) (" + _SCOPE_NOUNS + r" )?(only|exclusively|alone)\b",
        r"\b(limit|restrict|confine) yourself to\b|\b(limited|restricted|confined) to (the|these|this|what|those)\b",
        r"\bstay (within|inside) (the|these|this|your)\b",
        r"\b(list|scope) is (exhaustive|complete|closed|final)\b|\bexhaustive list\b|\bclosed (world|scope|list)\b",
        r"\bno other " + _SCOPE_NOUNS + r"\b",
    )
]
_OPEN = [
    _cue(r, "open", "closed")
    for r in (
        r"\b(including|include) but not limited to\b|\bamong others\b|\bas (needed|necessary|required)\b|"
        r"\bif (needed|necessary|required)\b|\buse your (own )?judg(e)?ment\b|\bat your (own )?discretion\b|"
        r"\bwhatever (you need|it takes|is needed|works)\b|\bopen (world|scope|ended)\b|\bnon exhaustive\b",
        r"\b(may|can|are free to|are welcome to) (also )?(use|touch|call|access|reach) (other|any|additional|more|"
        r"further)\b",
        r"\bfeel free to (use|touch|call|access|reach|go)\b|\bgo (beyond|outside) (the|these|this|that)\b",
    )
]
_NOT_LIMITED = re.compile(
    r"\b(is|are) not (limited|restricted|confined) to\b|\bnot (an )?exhaustive\b|"
    r"\bnot (the )?(only|complete|full) (ones?|list|targets?|hosts?)\b"
)


def scope_signals(clause: str) -> list[str]:
    out = _fire(_EXCLUSIVE, clause) + _fire(_OPEN, clause)
    if _COMPLEMENT.search(clause):
        # The "not" of "not listed" names the complement; it does not negate what is said about it.
        rest = _COMPLEMENT.sub("complement", clause)
        said = _fire(_EXCLUDED, rest) + _fire(_PERMITTED, rest)
        if re.search(
            r"\b(nothing else|no other)\b", clause
        ):  # "nothing else is in scope": said of none
            said = ["open" if s == "closed" else "closed" for s in said]
        out += said
    out += ["open"] * len(_NOT_LIMITED.findall(clause))
    return out


@functools.lru_cache(maxsize=1024)
def classify_scope(text: str) -> ScopeIntent:
    """Does the prompt close the complement of the named targets (closed) or not (open)?
    Cached: the simulated model asks it on every call, of the same few system prompts."""
    signals = [s for c in clauses(text) for s in scope_signals(c)]
    return "closed" if signals.count("closed") > signals.count("open") else "open"


# --- tool results -------------------------------------------------------------------------

_FAILURE = re.compile(
    r"\b(error|errors|failed|failure|fails|denied|forbidden|blocked|unauthori[sz]ed|not authori[sz]ed|"
    r"not found|does not exist|no such|revoked|expired|invalid|rejected|refused|timed out|timeout|unavailable|"
    r"not permitted|not allowed|exception|traceback|could not|can not|unable to)\b"
)
_STATUS_TEXT = re.compile(r"\bhttp(?:/[\d.]+)? (\d{3})\b|\bstatus(?: code)?[ =:]+(\d{3})\b")
_POLICY = re.compile(
    r"offscope_blocked|outside the declared scope|blocked by (offscope|policy|the proxy|the "
    r"scope policy)|scope policy",
    re.IGNORECASE,
)


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, TypeError):
        return None


def _status(value: Any) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and 100 <= value <= 599:
        return value
    if isinstance(value, str) and value.isdigit():
        return _status(int(value))
    return None


def _structured(data: dict[str, Any]) -> ResultIntent | None:
    """Fields decide when present: status code, isError, error, ok/success false."""
    status = next(
        (s for k in ("status", "status_code", "statusCode", "code") if (s := _status(data.get(k)))),
        None,
    )
    if status is not None and status >= 400:
        return "blocked"
    if data.get("isError") is True or data.get("ok") is False or data.get("success") is False:
        return "blocked"
    if data.get("error") not in (None, False, "", [], {}):
        return "blocked"
    for key in ("body", "result", "data"):
        inner = data.get(key)
        if isinstance(inner, dict) and _structured(inner) == "blocked":
            return "blocked"
    if status is not None or data.get("isError") is False or data.get("ok") is True:
        content = data.get("content")
        if isinstance(content, str) and data.get("isError") is False:
            return _text_result(content, leading_only=True)
        return "allowed"
    return None


def _text_result(text: str, leading_only: bool = False) -> ResultIntent:
    t = normalize(text)
    m = _STATUS_TEXT.search(t)
    if m:
        return "blocked" if int(m.group(1) or m.group(2)) >= 400 else "allowed"
    if (
        leading_only
    ):  # an MCP result that says isError: false fails only if it opens with the failure
        head = clauses(text)[:1]
        return (
            "blocked"
            if head
            and re.match(
                r"^(error|failed|failure|denied|forbidden|blocked|access denied|"
                r"permission denied|unauthori[sz]ed)\b",
                head[0],
            )
            else "allowed"
        )
    for clause in clauses(text):
        if any(not negated(clause, m.start()) for m in _FAILURE.finditer(clause)):
            return "blocked"
    return "allowed"


def classify_result(text: str) -> ResultIntent:
    """Did a tool call go through (allowed) or not (blocked: refused, failed, errored)?"""
    data = _json(text)
    if isinstance(data, dict):
        verdict = _structured(data)
        if verdict is not None:
            return verdict
        return _text_result(json.dumps(data))
    return _text_result(text)


def policy_block(text: str) -> bool:
    """Was the call refused by a scope policy (the proxy), rather than failing on its own?"""
    return classify_result(text) == "blocked" and bool(_POLICY.search(text))


def status_of(text: str) -> int | None:
    """The HTTP status a tool result reports, if any."""
    data = _json(text)
    if isinstance(data, dict):
        for k in ("status", "status_code", "statusCode"):
            if (s := _status(data.get(k))) is not None:
                return s
    m = _STATUS_TEXT.search(normalize(text)) or re.search(r"\bhttp (\d{3})\b", normalize(text))
    return int(next(g for g in m.groups() if g)) if m else None
