"""The specification's clauses, extracted from docs/spec/*.md, and their structural checks.

A clause is a paragraph starting ``**ID** (LEVEL, PROFILE) *Title.*`` and running to the end of
the paragraph that contains its ``Test:`` sentence (tables inside a clause are allowed).
"""

import re
from dataclasses import asdict, dataclass
from pathlib import Path

LEVELS = ("MUST", "SHOULD", "MAY")
TEST_KINDS = ("wire", "peer", "impair", "inspect")
# The profile tag of a clause: the smallest conformance profile it belongs to (docs/spec/12).
PROFILE_TAGS = ("Compat", "Base", "MULTIPATH", "CREDIT", "DELAY_TS", "CNP_EXT", "CSUM")

# prefix -> the document that owns it (mirrors the table in docs/spec/README.md)
PREFIX_FILES = {
    "WIRE": "01-encapsulation.md",
    "HDR": "02-headers.md", "ICRC": "02-headers.md",
    "QP": "03-rc-transport.md", "SEQ": "03-rc-transport.md", "PSN": "03-rc-transport.md",
    "RESP": "03-rc-transport.md", "ERR": "03-rc-transport.md",
    "COMPAT": "04-compat-mode.md",
    "EXT": "05-metaroce-mode.md", "SACK": "05-metaroce-mode.md", "PLACE": "05-metaroce-mode.md",
    "MP": "05-metaroce-mode.md", "CC": "05-metaroce-mode.md", "RTO": "05-metaroce-mode.md",
    "INT": "05-metaroce-mode.md",
    "CM": "06-connection.md",
    "SEC": "07-security.md",
    "SM": "08-state-machines.md",
    "EM": "09-errors.md",
    "PAR": "10-parameters.md",
    "REG": "11-registries.md", "VER": "11-registries.md",
    "PROF": "12-conformance.md",
}

_START = re.compile(r"^\*\*(?P<id>[^*\s]+)\*\* \((?P<level>[A-Z ]+)(?:, (?P<profile>[A-Za-z_]+))?\)"
                    r" \*(?P<title>[^*]+)\*")
_LOOSE = re.compile(r"^\*\*[A-Za-z]+-?[0-9]*\*\*")  # anything that looks like a clause start
_ID = re.compile(r"^(?P<prefix>[A-Z]{2,8})-(?P<num>[1-9][0-9]*)$")
KEYWORD = re.compile(r"\b(MUST|SHOULD|MAY)\b")
_TEST = re.compile(r"\bTest: (?P<kinds>[a-z/ ,]+?)(?:\s+—|\s+-|\.|$)", re.M)


@dataclass(frozen=True)
class Clause:
    id: str
    level: str
    profile: str
    title: str
    text: str
    file: str
    line: int
    tests: tuple

    @property
    def normative(self) -> str:
        """The clause text after its title and before its Test: sentence."""
        m = _START.match(self.text)
        return self.text[m.end() if m else 0:].split("Test:")[0]

    def to_dict(self) -> dict:
        d = asdict(self)
        d["tests"] = list(self.tests)
        return d


class SpecError(Exception):
    """The spec directory cannot be found."""


def spec_dir() -> Path:
    """docs/spec of the source tree, or the copy packaged as metaroce/_docs_spec."""
    pkg = Path(__file__).resolve().parent.parent
    for candidate in (pkg.parent / "docs" / "spec", pkg / "_docs_spec"):
        if (candidate / "README.md").is_file():
            return candidate
    raise SpecError("specification not found (expected docs/spec or metaroce/_docs_spec)")


def spec_files(root: Path | None = None) -> list[Path]:
    root = root or spec_dir()
    return sorted(p for p in root.glob("*.md") if p.name != "README.md")


def level_problem(level: str, normative: str) -> str | None:
    """A clause's level must match its content: the level's keyword occurs, no stronger one
    does, and a MUST clause holds no SHOULD (a recommendation inside a requirement is a
    separate clause). MAY inside a MUST or SHOULD clause is a permission and allowed. Keywords
    in `backticks` are quoted, not used."""
    found = set(KEYWORD.findall(re.sub(r"`[^`]*`", "", normative)))
    if not found:
        return "no MUST/SHOULD/MAY in the clause text"
    strongest = next(lv for lv in LEVELS if lv in found)
    if strongest != level:
        return f"labelled {level} but its strongest keyword is {strongest}"
    if level == "MUST" and "SHOULD" in found:
        return "a MUST clause with a SHOULD in it: split the recommendation into its own clause"
    return None


def _parse_file(path: Path, problems: list[str]) -> list[Clause]:
    lines = path.read_text(encoding="utf-8").splitlines()
    clauses, i = [], 0
    while i < len(lines):
        m = _START.match(lines[i])
        if not m:
            if _LOOSE.match(lines[i]):
                problems.append(f"{path.name}:{i + 1}: malformed clause start: {lines[i][:60]}")
            i += 1
            continue
        start, body, seen_test = i, [lines[i]], "Test:" in lines[i]
        i += 1
        while i < len(lines):
            line = lines[i]
            if _START.match(line) or line.startswith("#"):
                break
            if not line.strip() and seen_test:
                break
            body.append(line)
            seen_test = seen_test or "Test:" in line
            i += 1
        text = "\n".join(body).strip()
        head = f"{path.name}:{start + 1}: {m['id']}"
        if not seen_test:
            problems.append(f"{head}: no 'Test:' sentence before the next clause or heading")
        body_text = text[m.end():]
        normative = body_text.split("Test:")[0]
        if m["level"] not in LEVELS:
            problems.append(f"{head}: level {m['level']!r} is not one of {LEVELS}")
        else:
            why = level_problem(m["level"], normative)
            if why:
                problems.append(f"{head}: {why}")
        profile = m["profile"] or ""
        if profile not in PROFILE_TAGS:
            problems.append(f"{head}: profile {profile or '(none)'!r} is not one of "
                            f"{', '.join(PROFILE_TAGS)} (write '(LEVEL, PROFILE)')")
        tm = _TEST.search(body_text)
        kinds = tuple(k for k in re.split(r"[/ ,]+", tm["kinds"]) if k) if tm else ()
        if seen_test and (not kinds or any(k not in TEST_KINDS for k in kinds)):
            problems.append(f"{head}: Test: must start with one of {'/'.join(TEST_KINDS)}")
        clauses.append(Clause(m["id"], m["level"], profile, m["title"].strip().rstrip("."), text,
                              path.name, start + 1, kinds))
    return clauses


def parse(root: Path | None = None) -> tuple[list[Clause], list[str]]:
    """All clauses in document order, and the structural problems of their headers, levels,
    profiles, Test: sentences and identifiers."""
    problems: list[str] = []
    clauses: list[Clause] = []
    for path in spec_files(root):
        clauses.extend(_parse_file(path, problems))
    seen: dict[str, Clause] = {}
    for c in clauses:
        m = _ID.match(c.id)
        where = f"{c.file}:{c.line}: {c.id}"
        if not m:
            problems.append(f"{where}: malformed id (want PREFIX-N, e.g. WIRE-1)")
            continue
        owner = PREFIX_FILES.get(m["prefix"])
        if owner is None:
            problems.append(f"{where}: unknown prefix {m['prefix']}")
        elif owner != c.file:
            problems.append(f"{where}: prefix {m['prefix']} belongs in {owner}")
        if c.id in seen:
            problems.append(f"{where}: duplicate of {seen[c.id].file}:{seen[c.id].line}")
        seen.setdefault(c.id, c)
    return clauses, problems
