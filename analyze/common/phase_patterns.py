"""Users' own phase annotations: the name patterns that mark a prefill, a decode step or a request.

Owns the documented default patterns and the parsing of `--phase ROLE=REGEX` (CLI), `phases=`
(`tokentrace.analyze`), and `phases` in the TOML config `tokentrace check` reads. Patterns match
record_function / user annotation names, case-insensitively, over the whole name. Roles:

- `prefill`: a prompt pass; default `prefill`, `## prefill ##` (the PyTorch tutorials' style);
- `decode`: one decode step; default `decode`, `decode_step_<i>`, `decode_<i>`, `decode[<i>]`,
  `decode step <i>`, `## decode ##` (the first number in the name is the step's index);
- `request`: a whole generation (prompt plus its decode steps); default `generate`,
  `## generate ##`. It is not a phase: the forward passes inside it are found as without
  annotations, and it bounds them like a ProfilerStep does.

A pattern given for a role replaces that role's defaults; the other roles keep theirs.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from tokentrace.errors import TokentraceError

ROLES: tuple[str, ...] = ("prefill", "decode", "request")
_HASHES = r"(?:##\s*)?{}(?:\s*##)?"
DEFAULT_PATTERNS: dict[str, tuple[str, ...]] = {
    "prefill": (_HASHES.format(r"prefill"),),
    "decode": (_HASHES.format(r"decode(?:[_\s-]*step)?(?:[_\s-]*\d+|\[\d+\])?"),),
    "request": (_HASHES.format(r"generate"),),
}
_STEP_NUMBER = re.compile(r"\d+")

PhaseSpecs = tuple[tuple[str, str], ...]  # ((role, regex), ...), the typed Options field


@dataclass(frozen=True)
class PhasePatterns:
    """Compiled patterns per role, and whether each role's come from the user."""

    patterns: dict[str, tuple[re.Pattern[str], ...]]
    custom: frozenset[str]
    # Every role's patterns as one regex, a named group per role in ROLES order (see _combined).
    combined: re.Pattern[str] | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "combined", _combined(self.patterns))

    def role_of(self, name: str) -> str | None:
        """The first role whose pattern matches the whole name (roles in ROLES order), else None."""
        s = name.strip()
        if self.combined is not None:
            m = self.combined.fullmatch(s)
            return m.lastgroup if m else None
        for role in ROLES:
            if any(p.fullmatch(s) for p in self.patterns.get(role, ())):
                return role
        return None

    def describe(self) -> dict[str, list[str]]:
        """{role: [regex, ...]} as given (for the JSON summary: which patterns were used)."""
        return {role: [p.pattern for p in pats] for role, pats in self.patterns.items()}


def _combined(patterns: dict[str, tuple[re.Pattern[str], ...]]) -> re.Pattern[str] | None:
    """One regex of every role's patterns, `(?P<role>(?:p1)|(?:p2))|...` in ROLES order: a full
    match tries the alternatives in that order, so its group names the first role whose pattern
    matches the whole name (what testing each pattern gives, one search instead of up to one per
    pattern: ~0.5 ms over a trace's names). None where a pattern has groups of its own (their
    numbers and names would change in the union) or the union does not compile."""
    pats = [p for role in ROLES for p in patterns.get(role, ())]
    if not pats or any(p.groups for p in pats) or any(p.flags & ~(re.IGNORECASE | re.UNICODE) for p in pats) \
            or not all(p.flags & re.IGNORECASE for p in pats):
        return None
    parts = [f"(?P<{role}>" + "|".join(f"(?:{p.pattern})" for p in patterns[role]) + ")"
             for role in ROLES if patterns.get(role)]
    try:
        return re.compile("|".join(parts), re.IGNORECASE)
    except re.error:
        return None


def step_number(name: str) -> int:
    """The first number in a decode annotation's name (decode_step_3 -> 3), -1 when there is none."""
    m = _STEP_NUMBER.search(name)
    return int(m.group()) if m else -1


def parse_spec(spec: str, where: str = "--phase") -> tuple[str, str]:
    """`ROLE=REGEX` -> (role, regex); TokentraceError for an unknown role or a regex that does not compile."""
    role, sep, regex = spec.partition("=")
    role = role.strip().lower()
    if not sep or not regex:
        raise TokentraceError(f"{where}: '{spec}' is not ROLE=REGEX (roles: {', '.join(ROLES)})")
    return _checked(role, regex, where)


def _checked(role: str, regex: str, where: str) -> tuple[str, str]:
    if role not in ROLES:
        raise TokentraceError(f"{where}: unknown phase role '{role}' (roles: {', '.join(ROLES)})")
    try:
        re.compile(regex, re.IGNORECASE)
    except re.error as exc:
        raise TokentraceError(f"{where}: {role} pattern '{regex}' is not a valid regular expression ({exc})") from None
    return role, regex


def normalize(phases: Mapping[str, str | Iterable[str]] | Iterable[tuple[str, str] | str] | None,
              where: str = "phases") -> PhaseSpecs:
    """Specs in any accepted spelling -> ((role, regex), ...): a mapping {role: regex or [regex, ...]},
    pairs (role, regex), or "ROLE=REGEX" strings. Raises TokentraceError naming `where` for bad ones."""
    if phases is None:
        return ()
    out: list[tuple[str, str]] = []
    if isinstance(phases, Mapping):
        for role, value in phases.items():
            regexes = [value] if isinstance(value, str) else list(value)
            for regex in regexes:
                if not isinstance(regex, str):
                    raise TokentraceError(f"{where}: {role} pattern must be a string, not {regex!r}")
                out.append(_checked(str(role).strip().lower(), regex, where))
        return tuple(out)
    if isinstance(phases, str):
        return (parse_spec(phases, where),)
    for item in phases:
        if isinstance(item, str):
            out.append(parse_spec(item, where))
        elif isinstance(item, tuple) and len(item) == 2 and all(isinstance(x, str) for x in item):
            out.append(_checked(item[0].strip().lower(), item[1], where))
        else:
            raise TokentraceError(f"{where}: {item!r} is neither ROLE=REGEX nor a (role, regex) pair")
    return tuple(out)


def compile_patterns(specs: PhaseSpecs = ()) -> PhasePatterns:
    """The defaults, with each role the user gave replaced by the user's patterns."""
    custom: dict[str, list[str]] = {}
    for role, regex in specs:
        custom.setdefault(role, []).append(regex)
    chosen = {role: tuple(custom.get(role, DEFAULT_PATTERNS[role])) for role in ROLES}
    return PhasePatterns(patterns={role: tuple(re.compile(r, re.IGNORECASE) for r in regs) for role, regs in chosen.items()},
                         custom=frozenset(custom))
