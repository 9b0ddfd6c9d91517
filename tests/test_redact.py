"""Secrets never leave the process: names that look secret and credentials inside URLs."""

from lockstep.redact import redact_mapping, redact_value, scrub_text


def test_secret_names_are_redacted_but_comparable():
    a = redact_value("WANDB_API_KEY", "abc123")
    b = redact_value("WANDB_API_KEY", "abc123")
    c = redact_value("WANDB_API_KEY", "other")
    assert "abc123" not in a
    assert a == b != c
    assert a.startswith("<redacted:")


def test_url_credentials_are_scrubbed():
    text = scrub_text("pip index https://bob:hunter2@pypi.example.com/simple and more")
    assert "hunter2" not in text and "bob" not in text
    assert text.endswith("@pypi.example.com/simple and more")


def test_ordinary_values_pass_through():
    assert redact_value("NCCL_DEBUG", "INFO") == "INFO"


def test_nested_mapping():
    out = redact_mapping({"env": {"HF_TOKEN": "t0k", "OMP_NUM_THREADS": "4"}, "n": 3})
    assert "t0k" not in str(out)
    assert out["env"]["OMP_NUM_THREADS"] == "4"
    assert out["n"] == 3
