"""Keep secrets out of every output: secret-named values and secrets in free text, shown as
`<redacted:HMAC>`. Design: docs/design/redaction.md.
"""

from lockstep.redact.files import (
    redact_mapping,
    redact_value,
    scrub_argv,
    scrub_file,
    scrubbed_argv,
    scrubbed_log,
    scrubbed_logger,
)
from lockstep.redact.names import fingerprint_of, is_secret_name, redacted
from lockstep.redact.stream import LineScrubber, scrubbing_fifo
from lockstep.redact.text import add_secret_value, escape_controls, scrub_text

__all__ = [
    "LineScrubber",
    "add_secret_value",
    "escape_controls",
    "fingerprint_of",
    "is_secret_name",
    "redact_mapping",
    "redact_value",
    "redacted",
    "scrub_argv",
    "scrub_file",
    "scrub_text",
    "scrubbed_argv",
    "scrubbed_log",
    "scrubbed_logger",
    "scrubbing_fifo",
]
