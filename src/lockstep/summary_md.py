"""Markdown for a GitHub step summary, shared by `preflight` (`preflight.report`) and `gate`
(`gate.report`): a table cell's text escaped, and the summary appended to
`$GITHUB_STEP_SUMMARY`. Redaction is the caller's: what reaches here is already scrubbed."""

from __future__ import annotations

import os


def md_cell(text: object) -> str:
    """`text` as one Markdown table cell: `|` escaped, newlines made spaces."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def step_summary(text: str) -> bool:
    """Append `text` to $GITHUB_STEP_SUMMARY when it is set; True when written."""
    target = os.environ.get("GITHUB_STEP_SUMMARY")
    if not target:
        return False
    with open(target, "a", encoding="utf-8") as fh:
        fh.write(text + "\n")
    return True
