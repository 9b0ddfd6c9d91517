"""lockstep's private-name rule, which import-linter cannot express (run by `nox -s lint`):

1. Nothing outside a package imports its private names. A module of src/lockstep may import a
   `_name` (a private module, function, class or constant) only from its own top-level unit:
   `lockstep.checks.cli` may use `lockstep.checks.script_runs._x`, `lockstep.gate.job` may not; a
   top-level module (`lockstep/redact.py`) is a unit of its own, and `lockstep/__init__.py`
   belongs to none. Relative imports are resolved first; dunder names (`__version__`) are public.
   The tests beside src/ (`tests/`) are outside every unit: they import no private name of
   lockstep at all.
2. torch's and DeepSpeed's private APIs (`torch._C`, `from torch.distributed import _x`,
   `dist._x` through an imported module) are used only in lockstep/compat.py, so that a
   torch upgrade is one file to read.

    python3 ci/check-private-imports.py [SRC]    # SRC: the folder holding lockstep/ (default src)

Standard library only; the source is parsed, never imported. Exit 0, or 1 with one line per
breach (path:line: what), or 2 when a file cannot be parsed.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "lockstep"
THIRD_PARTY = ("torch", "deepspeed")
# The one module allowed to use THIRD_PARTY's private APIs (issue #25).
COMPAT = ("lockstep", "compat")


def private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def module_name(path: Path, src: Path) -> tuple[str, ...]:
    parts = path.relative_to(src).with_suffix("").parts
    return parts[:-1] if parts[-1] == "__init__" else parts


def resolve(node: ast.ImportFrom, module: tuple[str, ...], is_package: bool) -> tuple[str, ...]:
    """The absolute module a `from ... import` names."""
    if not node.level:
        return tuple((node.module or "").split("."))
    base = module if is_package else module[:-1]
    base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
    return base + (tuple(node.module.split(".")) if node.module else ())


def unit(module: tuple[str, ...]) -> str | None:
    """A module's top-level unit inside lockstep (its package or top-level module); None for
    lockstep itself."""
    return module[1] if len(module) > 1 and module[0] == PACKAGE else None


def breaches(path: Path, src: Path) -> Iterator[tuple[int, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    module = module_name(path, src)
    is_package = path.name == "__init__.py"
    own = unit(module)
    compat = module == COMPAT
    # Names bound to a torch/DeepSpeed module in this file (`import torch.distributed as dist`).
    third_party_aliases: dict[str, tuple[str, ...]] = {}

    def check(target: tuple[str, ...], line: int, shown: str) -> Iterator[tuple[int, str]]:
        if target[0] == PACKAGE:
            owner = unit(target)
            hidden = [p for p in target[1:] if private(p)]
            if hidden and owner != own:
                where = f"lockstep.{owner}" if owner else "lockstep"
                yield line, f"imports {shown}: a private name of {where} from outside it"
        elif target[0] in THIRD_PARTY and not compat and any(private(p) for p in target[1:]):
            yield line, f"imports {shown}: {target[0]}'s private API outside lockstep/compat.py"

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                target = tuple(alias.name.split("."))
                yield from check(target, node.lineno, alias.name)
                if target[0] in THIRD_PARTY:
                    bound = alias.asname or target[0]
                    third_party_aliases[bound] = target if alias.asname else target[:1]
        elif isinstance(node, ast.ImportFrom):
            base = resolve(node, module, is_package)
            for alias in node.names:
                if alias.name == "*":
                    yield from check(base, node.lineno, ".".join(base))
                    continue
                target = (*base, alias.name)
                yield from check(target, node.lineno, f"{'.'.join(base)}.{alias.name}")
                if base[0] in THIRD_PARTY:
                    third_party_aliases[alias.asname or alias.name] = target
    if compat:
        return

    def resolved(expr: ast.expr) -> tuple[str, ...] | None:
        """The torch/DeepSpeed path an expression names (`dist.distributed_c10d`), if any."""
        chain = []
        while isinstance(expr, ast.Attribute):
            chain.append(expr.attr)
            expr = expr.value
        if isinstance(expr, ast.Name) and expr.id in third_party_aliases:
            return (*third_party_aliases[expr.id], *reversed(chain))
        return None

    # Names bound to such a module by assignment (`c10d = dist.distributed_c10d`), in any scope.
    for _ in range(3):  # an alias of an alias
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and len(node.targets) == 1:
                target, path = node.targets[0], resolved(node.value)
                if isinstance(target, ast.Name) and path:
                    third_party_aliases.setdefault(target.id, path)
    # Attribute access through them (torch._C, c10d._world) and getattr(torch, "_x").
    for node in ast.walk(tree):
        path = None
        if isinstance(node, ast.Attribute) and private(node.attr):
            path = resolved(node)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "hasattr", "setattr")
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
            and private(node.args[1].value)
        ):
            base = resolved(node.args[0])
            path = (*base, node.args[1].value) if base else None
        if path and any(private(p) for p in path[1:]):
            yield (
                node.lineno,
                f"uses {'.'.join(path)}: {path[0]}'s private API outside lockstep/compat.py",
            )


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    src = Path(args[0]) if args else ROOT / "src"
    found = []
    for path in sorted((src / PACKAGE).rglob("*.py")):
        try:
            hits = sorted(set(breaches(path, src)))
        except (SyntaxError, UnicodeDecodeError, OSError) as err:
            print(f"check-private-imports: error: {path}: {err}", file=sys.stderr)
            return 2
        shown = path.relative_to(src.parent) if src.parent in path.parents else path
        found += [f"{shown}:{line}: {what}" for line, what in hits]
    tests = src.parent / "tests"
    for path in sorted(tests.rglob("*.py")) if tests.is_dir() else []:
        try:
            hits = sorted(set(breaches(path, tests.parent)))
        except (SyntaxError, UnicodeDecodeError, OSError) as err:
            print(f"check-private-imports: error: {path}: {err}", file=sys.stderr)
            return 2
        # A test reaches lockstep through its public names only (torch's privates are the
        # test's own business: it may check what compat.py wraps).
        found += [f"{path.relative_to(tests.parent)}:{line}: {what}" for line, what in hits
                  if "a private name of lockstep" in what]  # fmt: skip
    for line in found:
        print(line)
    if found:
        print(
            f"check-private-imports: {len(found)} breach(es) of the package rules", file=sys.stderr
        )
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
