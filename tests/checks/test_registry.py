"""The check registry drives the CLI, and a check's summary is printed as text, never markup."""

from lockstep.checks import cli, registry, resume
from lockstep.checks.result import CheckResult


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


def test_summary_with_brackets_is_printed_verbatim(capsys):
    summary = "runs in /tmp/[red]x[/red] and [bold]y"
    cli._report(CheckResult("determinism", False, summary, diagnosis="see [link]"))
    out = capsys.readouterr().out
    assert "FAIL determinism: runs in /tmp/[red]x[/red] and [bold]y" in out
    assert "see [link]" in out
