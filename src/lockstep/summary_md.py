"""Markdown for a GitHub step summary (preflight, check, gate); the caller redacts."""

from __future__ import annotations

import os


def md_cell(text: object) -> str:
    """`text` as one Markdown table cell."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def step_summary(text: str) -> bool:
    """Append `text` to $GITHUB_STEP_SUMMARY when set; True if written."""
    target = os.environ.get("GITHUB_STEP_SUMMARY")
    if not target:
        return False
    with open(target, "a", encoding="utf-8") as fh:
        fh.write(text + "\n")
    return True
