"""lockstep's size rule (run by `nox -s lint`): no module of src/lockstep over 450 lines and no
function over 80, so that each file holds one concept a reader can take in at once (issue #34).

A module or function that must stay larger is listed in EXCEPTIONS with the reason; an entry
that no longer exceeds its limit is reported too, so the list never outlives its reason.

    python3 ci/check-sizes.py [SRC]    # SRC: the folder holding lockstep/ (default src)

Standard library only; the source is parsed, never imported. Exit 0, or 1 with one line per
breach (path:line: what), or 2 when a file cannot be parsed.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAX_MODULE_LINES = 450
MAX_FUNCTION_LINES = 80

# "lockstep/path.py" (a module) or "lockstep/path.py:qualname" (a function) -> why it may exceed.
EXCEPTIONS: dict[str, str] = {}


def functions(tree: ast.AST):
    """(qualified name, node) of every function and method, nested ones included."""

    def walk(node: ast.AST, prefix: str):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    yield name, child
                yield from walk(child, name + ".")
            else:
                yield from walk(child, prefix)

    yield from walk(tree, "")


def breaches(src: Path) -> tuple[list[str], set[str]]:
    """One line per breach, and the EXCEPTIONS entries that were needed."""
    lines, used = [], set()
    for path in sorted((src / "lockstep").rglob("*.py")):
        rel = path.relative_to(src).as_posix()
        text = path.read_text(encoding="utf-8")
        count = len(text.splitlines())
        if count > MAX_MODULE_LINES:
            if rel in EXCEPTIONS:
                used.add(rel)
            else:
                lines.append(
                    f"src/{rel}:1: {count} lines, over {MAX_MODULE_LINES}: cut it along its concepts"
                )
        tree = ast.parse(text, str(path))
        for name, node in functions(tree):
            length = node.end_lineno - node.lineno + 1
            if length <= MAX_FUNCTION_LINES:
                continue
            key = f"{rel}:{name}"
            if key in EXCEPTIONS:
                used.add(key)
            else:
                lines.append(
                    f"src/{rel}:{node.lineno}: function {name} is {length} lines, over "
                    f"{MAX_FUNCTION_LINES}: split it"
                )
    return lines, used


def main(argv: list[str]) -> int:
    src = Path(argv[1]) if len(argv) > 1 else ROOT / "src"
    try:
        lines, used = breaches(src)
    except SyntaxError as err:
        print(f"check-sizes: error: {err.filename}:{err.lineno}: {err.msg}", file=sys.stderr)
        return 2
    lines += [
        f"ci/check-sizes.py: EXCEPTIONS[{key!r}] is no longer needed: remove it"
        for key in sorted(set(EXCEPTIONS) - used)
    ]
    for line in lines:
        print(line)
    if lines:
        print(f"check-sizes: {len(lines)} breach(es)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
