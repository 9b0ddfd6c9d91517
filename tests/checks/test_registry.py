"""The check registry drives the CLI, and a check's summary is printed as text, never markup."""

from lockstep.checks import cli, harness, registry
from lockstep.checks.result import CheckResult


def test_every_registered_check_is_runnable_where_the_registry_says():
    for name, check in registry.CHECKS.items():
        if check.launch in ("shared", "world-sizes", "resume"):
            assert name in harness.RANK_CHECKS, f"{name}: no rank-side function"
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
