"""Where each key and array element of a TOML document starts (1-based line numbers), so a
validation error can name the line it is about. tomllib checks the syntax first; this scanner
then only has to follow a valid document: table headers, arrays of tables, dotted and quoted
keys, strings of all four kinds, arrays and inline tables (nested), comments."""

from __future__ import annotations

import tomllib

Path = tuple  # of str keys and int array indices

_BARE = set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")


class _Scanner:
    def __init__(self, text: str):
        self.s = text
        self.i = 0
        self.line = 1
        self.loc: dict[Path, int] = {}

    # --- characters -------------------------------------------------------------------
    def peek(self, n: int = 1) -> str:
        return self.s[self.i:self.i + n]

    def adv(self, n: int = 1) -> None:
        self.line += self.s.count("\n", self.i, self.i + n)
        self.i += n

    def skip_ws(self, newlines: bool) -> None:
        while self.i < len(self.s):
            c = self.s[self.i]
            if c in " \t\r" or (newlines and c == "\n"):
                self.adv()
            elif c == "#":
                while self.i < len(self.s) and self.s[self.i] != "\n":
                    self.i += 1
            else:
                return

    def record(self, path: Path, line: int) -> None:
        self.loc.setdefault(path, line)

    # --- keys ---------------------------------------------------------------------------
    def key(self) -> list[str]:
        keys = []
        while True:
            self.skip_ws(False)
            c = self.peek()
            if c == '"':
                start = self.i
                self.skip_string()
                keys.append(tomllib.loads("k = " + self.s[start:self.i])["k"])
            elif c == "'":
                end = self.s.index("'", self.i + 1)
                keys.append(self.s[self.i + 1:end])
                self.i = end + 1
            else:
                start = self.i
                while self.i < len(self.s) and self.s[self.i] in _BARE:
                    self.i += 1
                keys.append(self.s[start:self.i])
            self.skip_ws(False)
            if self.peek() != ".":
                return keys
            self.adv()

    # --- values -------------------------------------------------------------------------
    def skip_string(self) -> None:
        for q in ('"""', "'''"):
            if self.peek(3) == q:
                j = self.i + 3
                while True:
                    j = self.s.index(q, j)
                    if q == '"""' and _escaped(self.s, j):
                        j += 1
                        continue
                    while self.s[j + 3:j + 4] == q[0]:      # up to two quotes may end the body
                        j += 1
                    break
                self.adv(j + 3 - self.i)
                return
        q = self.peek()
        j = self.i + 1
        while True:
            j = self.s.index(q, j)
            if q == '"' and _escaped(self.s, j):
                j += 1
                continue
            break
        self.i = j + 1

    def value(self, path: Path) -> None:
        self.skip_ws(False)
        self.record(path, self.line)
        c = self.peek()
        if c in "\"'":
            self.skip_string()
        elif c == "[":
            self.adv()
            n = 0
            while True:
                self.skip_ws(True)
                if self.peek() == "]":
                    self.adv()
                    return
                self.value(path + (n,))
                n += 1
                self.skip_ws(True)
                if self.peek() == ",":
                    self.adv()
        elif c == "{":
            self.adv()
            while True:
                self.skip_ws(True)
                if self.peek() == "}":
                    self.adv()
                    return
                line = self.line
                keys = self.key()
                self.record(path + tuple(keys), line)
                self.adv()                      # '='
                self.value(path + tuple(keys))
                self.skip_ws(True)
                if self.peek() == ",":
                    self.adv()
        else:                                   # number, bool, date-time: up to a delimiter
            while self.i < len(self.s) and self.s[self.i] not in ",]}\n#":
                self.i += 1

    # --- document -----------------------------------------------------------------------
    def document(self) -> dict[Path, int]:
        prefix: Path = ()
        aot: dict[Path, int] = {}          # array-of-tables path -> elements so far

        def resolve(keys: list[str]) -> Path:
            p: Path = ()
            for k in keys:
                p = p + (k,)
                if p in aot:                   # a key through an array of tables: its last element
                    p = p + (aot[p] - 1,)
            return p

        while True:
            self.skip_ws(True)
            if self.i >= len(self.s):
                return self.loc
            line = self.line
            if self.peek(2) == "[[":
                self.adv(2)
                keys = self.key()
                self.adv(2)
                p = resolve(keys[:-1]) + (keys[-1],)
                idx = aot.get(p, 0)
                aot[p] = idx + 1
                prefix = p + (idx,)
                self.record(p, line)
                self.record(prefix, line)
            elif self.peek() == "[":
                self.adv()
                keys = self.key()
                self.adv()
                prefix = resolve(keys)
                self.record(prefix, line)
            else:
                keys = self.key()
                path = prefix + tuple(keys)
                for n in range(len(prefix) + 1, len(path) + 1):    # dotted keys define tables
                    self.record(path[:n], line)
                self.adv()                      # '='
                self.value(path)


def _escaped(s: str, j: int) -> bool:
    """Is the quote at s[j] escaped by an odd number of backslashes?"""
    n = 0
    while j - 1 - n >= 0 and s[j - 1 - n] == "\\":
        n += 1
    return n % 2 == 1


def locate(text: str) -> dict[Path, int]:
    """{path: line} for every table, key and array element of a valid TOML document."""
    return _Scanner(text).document()


def line_of(loc: dict[Path, int], path: Path) -> int | None:
    """The line of path, or of its nearest located ancestor."""
    p = tuple(path)
    while p:
        if p in loc:
            return loc[p]
        p = p[:-1]
    return None
