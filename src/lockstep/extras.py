"""What a command needs beyond `pip install lockstep` (the extras of pyproject.toml), checked in
the launching process before any rank starts: a missing one is one line naming the extra to
install, exit 2, instead of every rank's traceback ending in ModuleNotFoundError.

`find_spec` only locates a module, it does not import it: the check costs milliseconds.
"""

from __future__ import annotations

import ast
import importlib.util
import shlex
from pathlib import Path

from lockstep.errors import UsageError

# module -> the extra of pyproject.toml's [project.optional-dependencies] that brings it
EXTRA_OF = {
    "transformers": "train",
    "wandb": "train",
    "deepspeed": "deepspeed",
    "pynvml": "gpu",
    "matplotlib": "plot",
    "lightning": "lightning",
    "pytorch_lightning": "lightning",
}
# lockstep's own modules that need an extra: the integration -> its framework
INTEGRATIONS = {"lockstep.integrations.lightning": "lightning",
                "lockstep.integrations.transformers": "transformers"}  # fmt: skip


def installed(module: str) -> bool:
    """`module` can be imported (found on sys.path; not imported)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package missing, or a broken finder
        return False


def require(what: str, needs: dict[str, str]) -> None:
    """Raise a one-line UsageError when a module of `needs` ({module: why}) is missing: `what`
    needs it, why, and the `pip install 'lockstep[EXTRA]'` that brings it."""
    missing = {module: why for module, why in needs.items() if not installed(module)}
    if not missing:
        return
    extras = ",".join(sorted({EXTRA_OF[m] for m in missing}))
    parts = [f"{m} ({why})" if why else m for m, why in missing.items()]
    hint = ""
    if set(missing) == {"wandb"}:
        hint = ", or set logging.wandb = 'disabled'"
    raise UsageError(
        f"{what} needs {' and '.join(parts)}, "
        f"{'which is' if len(parts) == 1 else 'which are'} not installed: "
        f"pip install 'lockstep[{extras}]'{hint}"
    )


def script_needs(command: str) -> dict[str, str]:
    """{module: why} for the extras a `--script` command's Python file imports unconditionally
    (a module-level import, not one under `try`); empty where the file cannot be read."""
    try:
        path = next((Path(w) for w in shlex.split(command) if w.endswith(".py")), None)
        tree = ast.parse(path.read_text(encoding="utf-8")) if path else None
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):  # the launch will say
        return {}
    needs = {}
    for node in tree.body if tree else []:
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
        for name in names:
            module = INTEGRATIONS.get(name, name.partition(".")[0])
            if module == "lightning" and installed("pytorch_lightning") and name in INTEGRATIONS:
                continue  # the integration runs on the standalone package too
            if module in EXTRA_OF:
                needs.setdefault(module, f"{path.name} imports {name}")
    return needs
