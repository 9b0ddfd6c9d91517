"""May this pull request's commit run on the GPU fleet? Main's rule, asked of GitHub's API.

A GPU run of a pull request needs, at the moment it is asked for (gpu-label.yml) and again when
it starts (gpu.yml's `image` job, since a dispatch by hand skips the label):

- the commit is the pull request's head now (a push after the review is not run);
- a maintainer (write, maintain or admin on the repository) approved a review *of that commit*,
  and did not later request changes or have the approval dismissed;
- with `--labeller LOGIN`: whoever added the `gpu-ci` label has write access or more.

    python3 -I main/ci/gpu-pr-gate.py --repo OWNER/REPO --pr N --sha SHA [--labeller LOGIN]

It calls `gh api` (GH_TOKEN from the job: pull-requests read, metadata). `--replay DIR` answers
each call from DIR/<path with / as _>.json instead: tests/test_gpu_pr_gate.py runs the rule on
API answers in GitHub's REST shapes. Exit 0 (allowed), 1 (refused, one line why), 2 (bad input).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

WRITERS = frozenset({"admin", "maintain", "write"})
# A review's verdict stands until the same reviewer gives another; comments change nothing.
VERDICTS = frozenset({"APPROVED", "CHANGES_REQUESTED", "DISMISSED"})


class Refused(Exception):
    pass


class BadInput(Exception):
    pass


Api = Callable[[str], object]


def gh_api(path: str) -> object:
    """One REST GET through the gh CLI; list endpoints are paginated and flattened."""
    command = ["gh", "api", "-H", "Accept: application/vnd.github+json", path]
    if path.endswith("/reviews"):
        command[2:2] = ["--paginate", "--slurp"]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise BadInput(f"gh api {path}: {err}") from None
    if done.returncode != 0:
        raise BadInput(f"gh api {path} failed: {done.stderr.strip().splitlines()[-1:]}")
    data = json.loads(done.stdout)
    if path.endswith("/reviews"):
        data = [review for page in data for review in page]
    return data


def replay(folder: Path) -> Api:
    def answer(path: str) -> object:
        file = folder / (path.replace("/", "_") + ".json")
        if not file.is_file():
            raise BadInput(f"gh api {path}: not found (404)")
        return json.loads(file.read_text())

    return answer


def permission(api: Api, repo: str, login: str) -> str:
    data = api(f"repos/{repo}/collaborators/{login}/permission")
    return str(data.get("permission", "none")) if isinstance(data, dict) else "none"


def check(api: Api, repo: str, pr: int, sha: str, labeller: str | None = None) -> str:
    """Why the run is allowed (one line); raises Refused with why not."""
    if labeller is not None:
        level = permission(api, repo, labeller)
        if level not in WRITERS:
            raise Refused(f"{labeller} added the label with {level} access; write or more needed")
    pull = api(f"repos/{repo}/pulls/{pr}")
    if not isinstance(pull, dict):
        raise BadInput(f"pull request #{pr}: unexpected answer")
    if pull.get("state") != "open":
        raise Refused(f"pull request #{pr} is {pull.get('state')}")
    head = (pull.get("head") or {}).get("sha")
    if head != sha:
        raise Refused(f"{sha[:12]} is not the head of #{pr} (now {str(head)[:12]}): label again")
    author = ((pull.get("user") or {}).get("login") or "").lower()
    latest: dict[str, dict] = {}
    for review in sorted(api(f"repos/{repo}/pulls/{pr}/reviews"), key=_submitted):
        login = ((review.get("user") or {}).get("login") or "").lower()
        if review.get("state") in VERDICTS and login and login != author:
            latest[login] = review
    approvers = [
        login
        for login, review in latest.items()
        if review.get("state") == "APPROVED" and review.get("commit_id") == sha
    ]
    maintainers = [login for login in approvers if permission(api, repo, login) in WRITERS]
    if not maintainers:
        stale = [login for login, r in latest.items() if r.get("state") == "APPROVED"]
        why = f" (approvals of older commits by {', '.join(stale)})" if stale else ""
        raise Refused(f"no maintainer approved {sha[:12]} of #{pr} in a review{why}")
    return f"#{pr} at {sha[:12]}: approved by {', '.join(sorted(maintainers))}"


def _submitted(review: dict) -> str:
    return str(review.get("submitted_at") or "")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="gpu-pr-gate.py", description=__doc__.split("\n")[0])
    parser.add_argument("--repo", required=True)
    parser.add_argument("--pr", required=True)
    parser.add_argument("--sha", required=True)
    parser.add_argument("--labeller")
    parser.add_argument("--replay", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    try:
        if not re.fullmatch(r"[A-Za-z0-9-]{1,39}/[A-Za-z0-9._-]{1,100}", args.repo):
            raise BadInput(f"--repo {args.repo!r} is not OWNER/REPO")
        if not re.fullmatch(r"[0-9]{1,9}", args.pr):
            raise BadInput(f"--pr must be a pull request number, got {args.pr!r}")
        if not re.fullmatch(r"[0-9a-f]{40}", args.sha):
            raise BadInput("--sha must be the head commit, 40 lower-case hex")
        if args.labeller is not None and not re.fullmatch(
            r"[A-Za-z0-9-]{1,39}(\[bot\])?", args.labeller
        ):
            raise BadInput(f"--labeller {args.labeller!r} is not a GitHub login")
        api = replay(args.replay) if args.replay else gh_api
        print(
            f"gpu-pr-gate: allowed: {check(api, args.repo, int(args.pr), args.sha, args.labeller)}"
        )
        return 0
    except Refused as err:
        print(f"gpu-pr-gate: refused: {err}", file=sys.stderr)
        return 1
    except (BadInput, ValueError, TypeError, AttributeError, RecursionError) as err:
        why = "an API answer nested too deep" if isinstance(err, RecursionError) else err
        print(f"gpu-pr-gate: error: {why}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
