"""Secrets never leave the process: secret names, and every form free text carries them in."""

import hashlib
import itertools
import subprocess
import sys

import pytest

from lockstep.redact import (
    fingerprint_of,
    is_secret_name,
    redact_mapping,
    redact_value,
    scrub_argv,
    scrub_text,
    scrubbed_log,
)


def test_secret_names_are_redacted_but_comparable():
    a = redact_value("WANDB_API_KEY", "abc123")
    b = redact_value("WANDB_API_KEY", "abc123")
    c = redact_value("WANDB_API_KEY", "other")
    assert "abc123" not in a
    assert a == b != c
    assert a.startswith("<redacted:")


@pytest.mark.parametrize(
    ("text", "secret"),
    [
        ("pip index https://bob:hunter2@pypi.example.com/simple", "hunter2"),
        ("https://user:p@ss@host/x", "ss@"),
        ("https://user:a/b@host/x", "a/b"),
        ("https://user:p ss@host:8080/x", "p ss"),
        ("git clone https://ghp_abc123@github.com/o/r", "ghp_abc123"),
        ("export AWS_SECRET_ACCESS_KEY=abcd1234 next", "abcd1234"),
        ("run --token=tok123 -x", "tok123"),
        ("run --api-key tok456 -x", "tok456"),
        ("Authorization: Bearer eyJabc.def", "eyJabc.def"),
        ('curl -H "Authorization: Basic dXNlcjpwdw=="', "dXNlcjpwdw=="),
        ('{"token": "j5on", "n": 1}', "j5on"),
        ("https://s3/x?X-Amz-Signature=deadbeef&a=b", "deadbeef"),
        ("https://h/x?sig=s1gn4ture&token=qq77", "s1gn4ture"),
        ("-----BEGIN RSA PRIVATE KEY-----\nMIIEow\n-----END RSA PRIVATE KEY-----", "MIIEow"),
        ("PGPASS: 9999", "9999"),
        ("DB_PASS=1234", "1234"),
        ("GPG_PASSPHRASE='open sesame'", "sesame"),
        ("PG_CONNECTION_STRING=Server=db;Pwd=s3", "Pwd=s3"),
    ],
)
def test_free_text_forms_are_scrubbed(text, secret):
    out = scrub_text(text)
    assert secret not in out and "<redacted:" in out, out


def test_ordinary_text_passes_through():
    text = "NCCL_DEBUG=INFO error: fine https://example.com/p a@b.com tokenizers==0.22 keyring=25"
    assert scrub_text(text) == text
    assert redact_value("NCCL_DEBUG", "INFO") == "INFO"


@pytest.mark.parametrize(
    "name",
    [
        "PGPASS",
        "DB_PASS",
        "PASSPHRASE",
        "SSH_PRIVATE",
        "CREDENTIAL",
        "COOKIE",
        "SESSION",
        "URL_SIGNATURE",
        "SQL_CONNECTION_STRING",
        "apiKey",
        "credentials",
        "X-Goog-Signature",
    ],
)
def test_secret_names(name):
    assert is_secret_name(name)


def test_nested_tuples_and_non_string_secrets():
    out = redact_mapping(
        {
            "env": {"HF_TOKEN": "t0k", "OMP_NUM_THREADS": "4"},
            "credentials": {"user": "alice", "pw": "x9"},
            "password": 12345678,
            "args": ("--token=tupl3", "ok"),
            "n": 3,
        }
    )
    text = str(out)
    for secret in ("t0k", "alice", "x9", "12345678", "tupl3"):
        assert secret not in text
    assert out["env"]["OMP_NUM_THREADS"] == "4" and out["n"] == 3


def test_short_secret_is_not_recoverable_from_its_digest(monkeypatch):
    """A 4-digit PIN: hashing every candidate, keyed or not, never reproduces the shown digest."""
    monkeypatch.delenv("LOCKSTEP_REDACT_SALT", raising=False)
    monkeypatch.delenv("LOCKSTEP_REDACT_KEY", raising=False)
    shown = fingerprint_of("4711")
    guesses = (f"{n:04d}" for n in range(10000))
    for guess, salt in itertools.product(guesses, ["", "\0"]):
        assert hashlib.sha256((salt + guess).encode()).hexdigest()[: len(shown)] != shown


def test_user_key_makes_separate_runs_comparable(monkeypatch):
    monkeypatch.delenv("LOCKSTEP_REDACT_SALT", raising=False)
    monkeypatch.setenv("LOCKSTEP_REDACT_KEY", "team-key")
    first = fingerprint_of("s3cret")
    monkeypatch.setenv("LOCKSTEP_REDACT_KEY", "team-key")
    assert fingerprint_of("s3cret") == first != fingerprint_of("other")
    monkeypatch.setenv("LOCKSTEP_REDACT_KEY", "another-key")
    assert fingerprint_of("s3cret") != first


def test_a_child_log_is_scrubbed_when_its_block_ends_even_by_an_error(tmp_path):
    log = tmp_path / "run.log"
    child = "import sys; print('https://u:hunter2@db/x API_KEY=kv-77'); sys.stderr.write('ok\\n')"
    with pytest.raises(TimeoutError), scrubbed_log(log) as out:
        subprocess.run(
            [sys.executable, "-c", child], stdout=out, stderr=subprocess.STDOUT, check=True
        )
        raise TimeoutError  # a timeout's kill leaves the block by an exception
    text = log.read_text()
    assert "hunter2" not in text and "kv-77" not in text
    assert "https://<redacted:" in text and "API_KEY=<redacted:" in text and "ok" in text


def test_a_command_line_is_scrubbed_argument_by_argument():
    argv = ["train", "--api-key", "kv-91", "--set", "api_token=t-92", "--set", "run_name=x:y@h"]
    argv += ["--set", "logging.run_name=https://u:pw-93@host/a", "--out", "/tmp/tokens"]
    clean = scrub_argv(argv)
    assert not any(s in " ".join(clean) for s in ("kv-91", "t-92", "pw-93"))
    assert clean[:2] == ["train", "--api-key"] and clean[-2:] == ["--out", "/tmp/tokens"]
    assert clean[6] == "run_name=x:y@h"  # nothing secret in it: left alone
