"""What a command needs beyond `pip install lockstep` (the extras of pyproject.toml), checked in
the launching process before any rank starts: a missing one is one line naming the extra to
install, exit 2, instead of every rank's traceback ending in ModuleNotFoundError.

`find_spec` only locates a module, it does not import it: the check costs milliseconds.
"""

from __future__ import annotations

import importlib.util

from lockstep.errors import UsageError

# module -> the extra of pyproject.toml's [project.optional-dependencies] that brings it
EXTRA_OF = {
    "transformers": "train",
    "wandb": "train",
    "deepspeed": "deepspeed",
    "pynvml": "gpu",
    "matplotlib": "plot",
}


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
