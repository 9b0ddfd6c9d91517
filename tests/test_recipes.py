"""docs/recipes/, run as written: each recipe's shell lines go through bash in a folder made from
examples/train_protocol.py, with cheaper settings appended (fewer steps, repeats and rounds,
ranks forked by --run-path where the command takes it), and what each says a command answers is
what it answers. The sbatch recipe needs Slurm: tests/cluster/test_recipe_sbatch.py.

Each recipe is under 40 lines and README links all three in its first screen; their `lockstep`
lines go through the CLI's parser and their links resolve, as tests/test_docs_commands.py does
for docs/*.md.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

from lockstep.checks.plans import show
from lockstep.checks.result import CheckResult
from lockstep.cli import build_parser
from lockstep.errors import EXIT_FAIL, EXIT_NOT_JUDGED, EXIT_OK, EXIT_TIMEOUT, EXIT_USAGE
from test_docs_commands import _anchors, _fenced_and_prose, extract, problem

ROOT = Path(__file__).resolve().parents[1]
RECIPES = ROOT / "docs" / "recipes"
NAMES = ("sbatch.md", "check-your-script.md", "gate-prs.md")
EXAMPLE = (ROOT / "examples" / "train_protocol.py").read_text()
TIMEOUT = 240  # one command: a few runs of 2 ranks on a busy 2-core runner


def blocks(name: str, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", (RECIPES / name).read_text(), re.S)


def shell_lines(name: str) -> list[str]:
    """The command lines of a recipe's bash blocks (comments kept: bash drops them)."""
    return [line for block in blocks(name, "bash") for line in block.splitlines() if line]


def bash(line: str, cwd: Path) -> subprocess.CompletedProcess:
    """One recipe line through bash, with this interpreter's `lockstep` first on PATH and no
    git configuration of the machine's; past TIMEOUT, its whole session is killed."""
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "OMP_NUM_THREADS": "1",
        "NO_COLOR": "1",
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_CONFIG_NOSYSTEM": "1",
        **{f"GIT_{who}_{what}": v for who in ("AUTHOR", "COMMITTER")
           for what, v in (("NAME", "t"), ("EMAIL", "t@t"))},
    }  # fmt: skip
    proc = subprocess.Popen(
        ["bash", "-c", line], cwd=cwd, env=env, text=True, start_new_session=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        out, err = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(f"`{line}` still running after {TIMEOUT}s: {err[-2000:]}") from None
    return subprocess.CompletedProcess(line, proc.returncode, out, err)


def said(proc: subprocess.CompletedProcess) -> str:
    return f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"


def test_three_recipes_under_40_lines_linked_from_readmes_first_screen():
    assert sorted(p.name for p in RECIPES.glob("*.md")) == sorted(NAMES)
    for name in NAMES:
        lines = (RECIPES / name).read_text().splitlines()
        assert len(lines) < 40, f"{name}: {len(lines)} lines"
    first_screen = "\n".join((ROOT / "README.md").read_text().splitlines()[:40])
    missing = [n for n in NAMES if f"(docs/recipes/{n})" not in first_screen]
    assert not missing, f"README's first 40 lines link no {missing}"


def test_recipe_commands_parse_and_links_resolve():
    parser, bad, commands = build_parser(), [], []
    for name in NAMES:
        path = RECIPES / name
        commands += extract(path.read_text(), name)
        _, prose = _fenced_and_prose(path.read_text())
        for target in re.findall(r"\]\(([^)\s]+)\)", prose):
            file, _, anchor = target.partition("#")
            dest = (path.parent / file).resolve()
            if not dest.exists() or (anchor and anchor not in _anchors(dest.read_text())):
                bad.append(f"{name}: {target}")
    bad += [f"{c.where} {c.text}: {problem(parser, c.text)}" for c in commands
            if problem(parser, c.text)]  # fmt: skip
    assert len(commands) >= 6 and not bad, bad


def cheap(line: str, **flags) -> str:
    """A recipe's lockstep line, its comment left out, with cheaper settings: each flag replaced
    where the line has it, appended where not (`run_path=True`: `--run-path`)."""
    line = line.split("  #")[0].rstrip()
    for name, value in flags.items():
        flag = "--" + name.replace("_", "-")
        if value is True:
            line += f" {flag}"
        elif re.search(rf"{flag} \S+", line):
            line = re.sub(rf"{flag} \S+", f"{flag} {value}", line)
        else:
            line += f" {flag} {value}"
    return line


def test_check_your_script_passes_the_example_and_says_what_its_table_says(tmp_path, capsys):
    check_all, check_one = shell_lines("check-your-script.md")
    (tmp_path / "train.py").write_text(EXAMPLE)
    passed = bash(cheap(check_all, steps=4, run_path=True), tmp_path)
    assert passed.returncode == EXIT_OK, said(passed)
    verdicts = [line.split(":")[0] for line in passed.stdout.splitlines() if line[:1].isupper()]
    assert verdicts == ["PASS determinism", "PASS resume", "PASS world-size", "PASS replicas"], (
        said(passed)
    )

    planted = tmp_path / "planted"  # an unseeded data order: the two runs part at step 1
    planted.mkdir()
    unseeded = EXAMPLE.replace("random.Random(epoch)", "random.Random()")
    assert unseeded != EXAMPLE
    (planted / "train.py").write_text(unseeded)
    failed = bash(cheap(check_one, steps=4, nproc=1, run_path=True), planted)
    assert failed.returncode == EXIT_FAIL, said(failed)
    assert failed.stdout.startswith("FAIL determinism: ") and "likely cause: " in failed.stdout
    assert list((planted / "runs").glob("determinism-*/run.log")), "--out runs keeps the runs"

    refused = bash(cheap(check_one, steps=1), planted)  # bad input: refused before any run
    assert refused.returncode == EXIT_USAGE, said(refused)
    assert refused.stderr.startswith("lockstep: error: "), said(refused)
    capsys.readouterr()
    show(CheckResult(name="world-size", passed=False, summary="why", judged=False))
    assert capsys.readouterr().out.startswith("NOT JUDGED world-size: why")

    # the table: the line each verdict prints, and its exit code
    table = (RECIPES / "check-your-script.md").read_text()
    rows = re.findall(r"^\| `(.+?) (?:name: )?\.\.\.` \| (\d) \|", table, re.M)
    assert rows == [
        ("PASS", str(EXIT_OK)), ("FAIL", str(EXIT_FAIL)), ("NOT JUDGED", str(EXIT_NOT_JUDGED)),
        ("lockstep: error:", str(EXIT_USAGE)), ("lockstep: error:", str(EXIT_TIMEOUT)),
    ], rows  # fmt: skip


def readme_workflow() -> str:
    blocks_ = re.findall(r"```yaml\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    (block,) = [b for b in blocks_ if "/lockstep@v0" in b]
    return block


def test_gate_prs_shows_readmes_workflow_as_it_is():
    assert blocks("gate-prs.md", "yaml") == [readme_workflow()]


# The example, each step padded to 0.1 s, as a GPU-bound step waits on its kernels: its speed then
# holds still on a busy runner, so a golden of 2 repeats gates it (the example's own ~10 ms steps
# vary by tens of percent here, and the gate says NOT JUDGED, as the recipe warns).
PADDED = (
    ("while step < (proto.max_steps or 20):\n",
     "while step < (proto.max_steps or 20):\n    began = __import__('time').perf_counter()\n"),
    ("    dist.all_reduce(loss := loss.detach())\n",
     "    __import__('time').sleep(max(0.0, 0.1 - (__import__('time').perf_counter() - began)))\n"
     "    dist.all_reduce(loss := loss.detach())\n"),
)  # fmt: skip


def test_gate_prs_records_on_the_runner_commits_and_checks_then_ab(tmp_path):
    lines = shell_lines("gate-prs.md")
    repo = tmp_path / "repo"
    repo.mkdir()
    source = EXAMPLE
    for old, new in PADDED:
        assert source.count(old) == 1, old
        source = source.replace(old, new)
    (repo / "train.py").write_text(source)
    for setup in ("git init -q -b main", "git add train.py", "git commit -qm main",
                  "git update-ref refs/remotes/origin/main HEAD"):  # fmt: skip
        assert bash(setup, repo).returncode == 0, setup
    # what each line answers: no golden for this runner yet (exit 2), then plain shell, then a
    # pass against the golden just committed, and an A/B of 2 rounds that no change can fail
    # (its smallest one-sided p is 1/6, never below the 0.01 a failure needs)
    assert "exit 2" in lines[0].split("  #")[1], lines[0]
    expected = [EXIT_USAGE, 0, 0, EXIT_OK, EXIT_OK]
    assert len(lines) == len(expected), lines
    reports = []
    for line, code in zip(lines, expected, strict=True):
        if line.startswith("gh run download"):
            # the artifact lockstep-golden is the candidate folder (tests/ci/test_action.py)
            assert "-n lockstep-golden -D gates" in line, line
            line = "mkdir -p gates && cp -R candidate/. gates/"
        elif line.startswith("lockstep gate check"):
            reports.append(repo / f"gate-{len(reports)}.json")
            extra = {"repeats": 2} if "--candidate" in line else {}
            line = cheap(line, steps=6, run_path=True, json=reports[-1], **extra)
        elif line.startswith("lockstep gate ab"):
            line = cheap(line, steps=6, rounds=2, nproc=1)
        done = bash(line, repo)
        assert done.returncode == code, (line, said(done))
    (golden,) = (repo / "candidate" / "train").glob("*.json")  # where the comment says
    committed = bash("git show --stat --format=%s HEAD", repo).stdout
    assert "gate train: golden for this runner" in committed and f"gates/train/{golden.name}" in (
        committed
    ), committed
    checked = json.loads(reports[-1].read_text())
    assert checked["passed"] and {f["status"] for f in checked["findings"]} == {"pass"}, checked
    assert {"loss", "step_time_s"} <= {f["metric"] for f in checked["findings"]}, checked
