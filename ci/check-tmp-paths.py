"""No fixed /tmp path in the repository's scripts (run by `nox -s lint`; shellcheck has no such
rule). /tmp is shared by every user of a machine: a path there that a script names in advance
(`/tmp/site`, `/tmp/$tarball`) can be made first by another local user, as a folder of their
own, a symbolic link or a file, and the script then installs, runs or logs through what they
planted, as whoever runs it (root, for the runner's setup). A script makes its own with
`mktemp -d` (a fresh folder only its user can enter) and removes it in a trap.

Scanned: every file under ci/ and docker/, .github/workflows/, smoke/, .ci/run and noxfile.py.
Flagged: a path that starts with `/tmp` on a line of code (a comment line is prose), unless the
line calls `mktemp` (`mktemp -d /tmp/name.XXXXXX` is a fresh folder too); in Python, a string
that holds one (docstrings are prose). A file that must keep one is listed in ALLOWED with
the reason; an entry whose file no longer holds one is reported too, so the list never
outlives its reason.

    python3 ci/check-tmp-paths.py [ROOT]    # ROOT: the repository (default: this one)

Standard library only. Exit 0, or 1 with one line per finding (path:line: what).
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# A path in /tmp: `/tmp/x`, `/tmp` alone, `${TMPDIR:-/tmp}`; not `/var/tmp`, `$tmp/`, `~/tmp`.
TMP = re.compile(r"(?<![\w.~$/])/tmp(?![\w.-])")
COMMENT = re.compile(r"^\s*(#|//|;)")

# path (relative to ROOT) -> why it may name a fixed /tmp path.
ALLOWED: dict[str, str] = {
    "docker/Dockerfile": (
        "COPY into /tmp/lockstep-src of an image build stage: the build's own filesystem, "
        "where no other user runs; install-lock.sh --source removes it"
    ),
    "docker/install-lock.sh": (
        "runs only inside the image build (its usage line): the build container's own /tmp, "
        "one user, nothing else running there"
    ),
}


def scanned(root: Path) -> list[Path]:
    files = [p for folder in ("ci", "docker") for p in sorted((root / folder).rglob("*"))]
    files += sorted((root / ".github" / "workflows").glob("*"))
    files += sorted((root / "smoke").rglob("*"))
    files += [root / ".ci" / "run", root / "noxfile.py"]
    itself = root / "ci" / Path(__file__).name  # its strings name what it looks for
    return [p for p in files if p.is_file() and "__pycache__" not in p.parts and p != itself]


def shell_findings(text: str) -> list[tuple[int, str]]:
    """(line, the line) of each line of code naming a /tmp path outside a mktemp call."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        if COMMENT.match(line) or "mktemp" in line:
            continue
        if TMP.search(line):
            found.append((number, line.strip()))
    return found


def python_findings(text: str) -> list[tuple[int, str]]:
    """(line, the string) of each string of code (no docstring) naming a /tmp path."""
    tree = ast.parse(text)
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                docstrings.add(id(body[0].value))
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in docstrings
        and TMP.search(node.value)
        and "XXX" not in node.value
    ]


def findings(path: Path) -> list[tuple[int, str]]:
    try:
        text = path.read_text()
    except UnicodeDecodeError:
        return []  # not a script
    if path.suffix == ".py":
        return python_findings(text)
    return shell_findings(text)


def main(argv: list[str]) -> int:
    root = Path(argv[0]).resolve() if argv else ROOT
    problems = []
    holding = set()
    for path in scanned(root):
        rel = path.relative_to(root).as_posix()
        found = findings(path)
        if found:
            holding.add(rel)
        if rel in ALLOWED:
            continue
        for number, what in found:
            problems.append(
                f"{rel}:{number}: a fixed /tmp path ({what[:120]}): make the folder with "
                "`mktemp -d` and remove it in a trap (or list the file in ALLOWED with why)"
            )
    for rel in sorted(set(ALLOWED) - holding):
        problems.append(f"{rel}: listed in ALLOWED but names no fixed /tmp path now; drop it")
    for line in problems:
        print(f"check-tmp-paths: {line}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
