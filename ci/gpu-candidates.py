"""May this GPU run hand out candidate goldens? Main's rule, decided before the commit is fetched.

A maintainer commits a candidate golden as the truth later runs are gated against, so one
recorded by a pull request's code would let that code set its own bar. The check used to live
in noxfile.py, the very file a pull request's run takes from the pull request. Now gpu.yml's
hosted `image` job (main's definition, main's scripts) runs this before it checks out the commit
under test, and the GPU job uploads `build/gate/candidates/` as the `gpu-gate-candidates`
artifact only when it printed `candidates=true`; the reports artifact never holds that folder.
Whatever the commit's own files do, a pull request's run hands out no candidate.

    python3 -I main/ci/gpu-candidates.py --event "$GITHUB_EVENT_NAME" --ref "$GITHUB_REF" --pr "$PR"

Candidates come from main's code only: a push, a dispatch or a schedule on refs/heads/main,
with no pull request named. Prints `candidates=true|false` for $GITHUB_OUTPUT and why on stderr;
exit 0, or 2 with one line on bad input.
"""

from __future__ import annotations

import argparse
import re
import sys

MAIN = "refs/heads/main"
MAINS_EVENTS = ("push", "workflow_dispatch", "schedule")


def allowed(event: str, ref: str, pr: str) -> tuple[bool, str]:
    """Whether this run's candidates are main's, and why (one line)."""
    if pr:
        return False, f"this run tests pull request #{pr}'s code"
    if ref != MAIN:
        return False, f"{event} on {ref}, not {MAIN}"
    if event not in MAINS_EVENTS:
        return False, f"{event} is not an event that runs main's code"
    return True, f"{event} on {MAIN}: main's code"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="gpu-candidates.py", description=__doc__.split("\n")[0])
    parser.add_argument("--event", required=True, help="GITHUB_EVENT_NAME")
    parser.add_argument("--ref", required=True, help="GITHUB_REF")
    parser.add_argument("--pr", default="", help="the dispatched pull request's number, or empty")
    args = parser.parse_args(argv)
    for name, value, shape in (
        ("--event", args.event, r"[a-z_]{1,64}"),
        ("--ref", args.ref, r"refs/[A-Za-z0-9._/-]{1,250}"),
        ("--pr", args.pr, r"(?:[0-9]{1,9})?"),
    ):
        if not re.fullmatch(shape, value):
            print(f"gpu-candidates: error: {name} {value[:80]!r} is not {shape}", file=sys.stderr)
            return 2
    ok, why = allowed(args.event, args.ref, args.pr)
    print(f"candidates={'true' if ok else 'false'}")
    print(f"gpu-candidates: {'candidate goldens' if ok else 'no candidate golden'}: {why}",
          file=sys.stderr)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
