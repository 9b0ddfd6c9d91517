"""Keep secrets out of every output: secret-looking names, and secrets inside free text.

A redacted value is shown as `<redacted:HMAC>`, 64 bits of HMAC-SHA256 under a key that no
output contains, so even a 4-digit secret cannot be recovered by hashing guesses, while two
ranks whose values of the same secret differ still show as a mismatch. The key is, in order:
`LOCKSTEP_REDACT_SALT` (one random key per preflight job, shared by its ranks through the
rendezvous store); `LOCKSTEP_REDACT_KEY` (yours: set the same value when making fingerprint files
with `lockstep fingerprint` that `lockstep diff` should compare); else a random key per process.

Names: KEY, TOKEN, SECRET, PASSWORD/PASSWD/PASSPHRASE, PGPASS and *_PASS, PRIVATE, CREDENTIAL,
COOKIE, SESSION, SIGNATURE, AUTH, *_CONNECTION_STRING (any case), and one word ending in TOKEN,
SECRET or PASSWORD (Docker's `identitytoken`). Under a secret-named key the whole value goes,
nested or not, whatever its type. Free text: credentials in URLs (passwords holding `@`, `/` or
spaces too), `NAME=value`, `--name=value`, `--name value`, `NAME: value`, `"name": "value"`
(JSON), Authorization headers and bearer tokens, secret query parameters of signed URLs, PEM
private keys (their bodies without BEGIN too), .netrc lines, known token shapes, base64 Basic
credentials and base64 JSON holding a secret, the password after curl's `-u` or `--user`, the
key after `wandb login`, and secrets known by value (preflight's job key, `add_secret_value`).

The modules: `names` (which names are secret, the digest shown), `text` (free text), `forms`
(the forms found by scans of their own), `stream` (a log scrubbed as it is written), `files`
(command lines, logs, mappings). What code outside uses is exported here.
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
