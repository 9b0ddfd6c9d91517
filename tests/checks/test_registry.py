"""The check registry drives the CLI, and a check's summary is printed as text, never markup."""

from lockstep.checks import plans, registry, resume
from lockstep.checks.result import CheckResult
from lockstep.cli import main
from lockstep.errors import EXIT_FAIL


def test_every_registered_check_is_runnable_where_the_registry_says():
    for name, check in registry.CHECKS.items():
        if check.plan is None or name in ("world-size", "resume"):
            assert callable(check.rank.resolve()), f"{name}: no rank-side function"
        for function in (check.rank, check.plan, check.script and check.script.run):
            assert function is None or callable(function.resolve()), f"{name}: {function}"
    assert registry.CHECKS["resume"].rank.resolve() is resume.check_resume
    assert registry.names(script=True) == ("determinism", "resume", "world-size", "replicas")
    assert registry.shared(registry.names()) == (
        "determinism", "clip", "equivalence", "accumulation", "replicas",
    )  # fmt: skip


def test_summary_with_brackets_is_printed_verbatim(capsys, monkeypatch, tmp_path):
    """`lockstep check` shows each result as it comes (`plans.run`'s `show`), as plain text."""
    summary = "runs in /tmp/[red]x[/red] and [bold]y"

    def ran(request, show):
        result = CheckResult("determinism", False, summary, diagnosis="see [link]")
        show(result)
        return plans.Outcome([result], tmp_path)

    monkeypatch.setattr(plans, "run", ran)
    assert main(["check", "determinism", "run.toml"]) == EXIT_FAIL
    out = capsys.readouterr().out
    assert "FAIL determinism: runs in /tmp/[red]x[/red] and [bold]y" in out
    assert "see [link]" in out
