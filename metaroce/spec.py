"""The specification's clauses, extracted from docs/spec/*.md, and the clause lint.

A clause is a paragraph starting ``**ID** (LEVEL) *Title.*`` and running to the end of the
paragraph that contains its ``Test:`` sentence (tables inside a clause are allowed).
"""

import re
from dataclasses import asdict, dataclass
from pathlib import Path

LEVELS = ("MUST", "SHOULD", "MAY")
TEST_KINDS = ("wire", "peer", "impair", "inspect")

# prefix -> the document that owns it (mirrors the table in docs/spec/README.md)
PREFIX_FILES = {
    "WIRE": "01-encapsulation.md",
    "HDR": "02-headers.md", "ICRC": "02-headers.md",
    "QP": "03-rc-transport.md", "SEQ": "03-rc-transport.md", "PSN": "03-rc-transport.md",
    "RESP": "03-rc-transport.md", "ERR": "03-rc-transport.md",
    "COMPAT": "04-compat-mode.md",
    "EXT": "05-metaroce-mode.md", "SACK": "05-metaroce-mode.md", "PLACE": "05-metaroce-mode.md",
    "MP": "05-metaroce-mode.md", "CC": "05-metaroce-mode.md", "RTO": "05-metaroce-mode.md",
    "CM": "06-connection.md",
    "SEC": "07-security.md",
}

_START = re.compile(r"^\*\*(?P<id>[^*\s]+)\*\* \((?P<level>[A-Z ]+)\) \*(?P<title>[^*]+)\*")
_LOOSE = re.compile(r"^\*\*[A-Za-z]+-?[0-9]*\*\*")  # anything that looks like a clause start
_ID = re.compile(r"^(?P<prefix>[A-Z]{2,8})-(?P<num>[1-9][0-9]*)$")
_KEYWORD = re.compile(r"\b(MUST|SHOULD|MAY)\b")
_TEST = re.compile(r"\bTest: (?P<kinds>[a-z/ ,]+?)(?:\s+—|\s+-|\.|$)", re.M)


@dataclass(frozen=True)
class Clause:
    id: str
    level: str
    title: str
    text: str
    file: str
    line: int
    tests: tuple

    def to_dict(self) -> dict:
        d = asdict(self)
        d["tests"] = list(self.tests)
        return d


class SpecError(Exception):
    """The spec directory cannot be found."""


def spec_dir() -> Path:
    """docs/spec of the source tree, or the copy packaged as metaroce/_docs_spec."""
    here = Path(__file__).resolve().parent
    for candidate in (here.parent / "docs" / "spec", here / "_docs_spec"):
        if (candidate / "README.md").is_file():
            return candidate
    raise SpecError("specification not found (expected docs/spec or metaroce/_docs_spec)")


def spec_files(root: Path | None = None) -> list[Path]:
    root = root or spec_dir()
    return sorted(p for p in root.glob("*.md") if p.name != "README.md")


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
        found = set(_KEYWORD.findall(normative))
        strongest = next((lv for lv in LEVELS if lv in found), None)
        if m["level"] not in LEVELS:
            problems.append(f"{head}: level {m['level']!r} is not one of {LEVELS}")
        elif strongest is None:
            problems.append(f"{head}: no MUST/SHOULD/MAY in the clause text")
        elif strongest != m["level"]:
            problems.append(f"{head}: labelled {m['level']} but its strongest keyword is {strongest}")
        tm = _TEST.search(body_text)
        kinds = tuple(k for k in re.split(r"[/ ,]+", tm["kinds"]) if k) if tm else ()
        if seen_test and (not kinds or any(k not in TEST_KINDS for k in kinds)):
            problems.append(f"{head}: Test: must start with one of {'/'.join(TEST_KINDS)}")
        clauses.append(Clause(m["id"], m["level"], m["title"].strip().rstrip("."), text,
                              path.name, start + 1, kinds))
    return clauses


def load(root: Path | None = None) -> tuple[list[Clause], list[str]]:
    """All clauses in document order, and the lint problems found (empty when clean)."""
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


def clauses(root: Path | None = None) -> list[Clause]:
    return load(root)[0]


def lint(root: Path | None = None) -> list[str]:
    return load(root)[1]
