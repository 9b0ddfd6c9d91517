"""Run config pieces the tests share: a quiet run (no wandb, no progress bar) as a config's
section (`QUIET`) and as `--set` overrides (`QUIET_SETS`; `set_args` spells them for a
command line), and `assert_passed` for a check's result."""

QUIET = {"logging": {"wandb": "disabled", "progress": False}}
QUIET_SETS = ('logging.wandb="disabled"', "logging.progress=false")


def set_args(*overrides: str) -> list[str]:
    """`--set KEY=VALUE` for each override."""
    return [arg for override in overrides for arg in ("--set", override)]


def assert_passed(result) -> None:
    """A check's result passed; else its summary and likely cause."""
    assert result.passed, f"{result.summary} | {result.diagnosis}"
