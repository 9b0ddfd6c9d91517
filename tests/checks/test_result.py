"""A check's verdict and the exit code of several: a failure outranks a missing judgement,
and a check that could not judge is never a pass."""

from lockstep.checks.result import CheckResult, exit_code


def test_verdicts_and_exit_code():
    ok = CheckResult("determinism", True, "agree")
    bad = CheckResult("resume", False, "diverge at step 3")
    undecided = CheckResult("world-size", False, "no noise floor", judged=False)
    assert (ok.verdict, bad.verdict, undecided.verdict) == ("pass", "fail", "not_judged")
    assert undecided.to_dict()["passed"] is False
    assert exit_code([ok]) == 0
    assert exit_code([ok, undecided]) == 4
    assert exit_code([undecided, bad]) == 1
    assert exit_code([]) == 4  # nothing compared is not a pass
