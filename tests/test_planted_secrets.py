"""Planted secrets, as an attacker would look for them: one value per form, planted in the
environment, in config overrides, in a failing script's output and in exception text; then
every output lockstep writes (terminal, --json, the step summary, metrics.jsonl, the wandb run
directory, check reports, error lines) is searched for every planted value.

One test on purpose: it runs the real commands once (fingerprint, a 2-rank preflight, a short
training, a training whose rank raises, a failing training override, a check on a crashing
script) and reads everything.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from inprocess import run_main
from lockstep.env.launcher import LAUNCHER_VARIABLES

ROOT = Path(__file__).resolve().parents[1]

# The values attackers look for; each unique, long enough that a hit is never chance.
PIN = "4711"  # short: must not be recoverable from any digest either
SECRETS = {
    "url_at": "p4ss@w0rd@",
    "url_space": "pa55 w0rd",
    "url_slash": "pa/55wd",
    "key_value": "kv-s3cret-9812",
    "flag_eq": "flag-tok-7731",
    "flag_space": "flag-tok-5512",
    "bearer": "eyJhbGciOi.bearer-8821",
    "json": "json-tok-6644",
    "query": "q-tok-9931",
    "signature": "deadbeef5517sig",
    "pem": "MIIEowIBAAKCAQEAplanted",
    "pgpass": "pg-pass-3317",
    "db_pass": "db-pass-4429",
    "passphrase": "open-sesame-2281",
    "private": "priv-material-6627",
    "credential": "cred-val-1184",
    "cookie": "cookie-val-7719",
    "session": "session-val-3392",
    "conn": "Server=db;Pwd=conn-9921",
    "nested": "nested-cred-5573",
    "pin": PIN,
}
S = SECRETS
FREE_TEXT = (
    f"https://alice:{S['url_at']}ex.com/a https://bob:{S['url_space']}@ex.com/b "
    f"https://carol:{S['url_slash']}@ex.com/c API_KEY={S['key_value']} --token={S['flag_eq']} "
    f"--api-key {S['flag_space']} Authorization: Bearer {S['bearer']}"
)
JSON_TEXT = json.dumps({"token": S["json"], "credentials": {"password": S["nested"]}})
SIGNED_URL = f"https://s3.ex.com/o?token={S['query']}&X-Amz-Signature={S['signature']}&a=1"
PEM = f"-----BEGIN RSA PRIVATE KEY-----\n{S['pem']}\n-----END RSA PRIVATE KEY-----"

# Collected into fingerprints (NCCL_/TORCH_/... prefixes), so they reach every report.
ENV = {
    "TORCH_PGPASS": S["pgpass"],
    "NCCL_DB_PASS": S["db_pass"],
    "TORCH_GPG_PASSPHRASE": S["passphrase"],
    "TORCH_SSH_PRIVATE": S["private"],
    "TORCH_CREDENTIAL": S["credential"],
    "TORCH_COOKIE": S["cookie"],
    "TORCH_SESSION": S["session"],
    "TORCH_DB_CONNECTION_STRING": S["conn"],
    "TORCH_PIN_PASSWORD": PIN,
    "TORCH_EXTRA_ARGS": FREE_TEXT,
    "TORCH_JSON_CONFIG": JSON_TEXT,
    "TORCH_MODEL_URL": SIGNED_URL,
    "TORCH_TLS_KEY": PEM,
}

CRASHING_SCRIPT = f"""
import sys
print({FREE_TEXT!r}, file=sys.stderr)
print({SIGNED_URL!r}, {JSON_TEXT!r}, file=sys.stderr)
raise RuntimeError("cannot reach " + {FREE_TEXT!r} + " " + {PEM!r})
"""

# A data factory whose source is unreachable: the exception is raised inside a rank, and
# torchelastic logs that rank's traceback from the launching process.
LEAKY_DATA = f"""
def data(seq_len, vocab_size):
    raise ConnectionError("cannot reach " + {FREE_TEXT!r} + " " + {SIGNED_URL!r} + " " + {PEM!r})
"""
INPUTS = ("crash.py", "leaky_data.py")


def lockstep(args: list[str], cwd: Path, env: dict) -> str:
    """The console script for the first command, the CLI's main in this process (its own
    stdout/stderr file descriptors, environment and folder) for the others."""
    if args[0] == "fingerprint":
        result = subprocess.run(
            [sys.executable, "-m", "lockstep", *args],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
    else:
        result = run_main(args, cwd, environ=env)
    # The command line itself is the test's, not lockstep's output: only the exit code is kept.
    return f"$ lockstep {args[0]} -> {result.returncode}\n{result.stdout}{result.stderr}"


def test_no_planted_secret_reaches_any_output(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    summary = out / "step-summary.md"
    # A clean launch: no launcher variable another test may have left in this worker's
    # environment (a half-set launcher makes preflight exit 2 before it writes anything).
    base = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARIABLES}
    env = dict(base, **ENV, GITHUB_STEP_SUMMARY=str(summary), WANDB_MODE="offline")
    env.pop("LOCKSTEP_REDACT_KEY", None)
    env.pop("LOCKSTEP_REDACT_SALT", None)
    (tmp_path / "crash.py").write_text(CRASHING_SCRIPT)
    (tmp_path / "leaky_data.py").write_text(LEAKY_DATA)
    cfg = str(ROOT / "smoke" / "cpu-ddp.toml")

    terminal = [
        lockstep(["fingerprint", "--json", str(out / "fp.json")], tmp_path, env),
        lockstep(
            [
                "preflight",
                "--nproc",
                "2",
                "--timeout",
                "300",
                "--json",
                str(out / "preflight.json"),
            ],
            tmp_path,
            env,
        ),
        lockstep(
            [
                "train",
                cfg,
                "--nproc",
                "1",
                "--out",
                str(out / "train"),
                "--set",
                "steps=2",
                "--set",
                "checkpoint.every=0",
                "--set",
                f"logging.run_name={FREE_TEXT} {SIGNED_URL}",
            ],
            tmp_path,
            env,
        ),
        lockstep(
            [
                "train",
                cfg,
                "--nproc",
                "1",
                "--out",
                str(out / "crash"),
                "--set",
                "data.factory=leaky_data:data",
                "--set",
                "logging.wandb=disabled",
            ],
            tmp_path,
            env,
        ),
        lockstep(
            [
                "train",
                cfg,
                "--out",
                str(out / "bad"),
                "--set",
                f"model.preset={JSON_TEXT}",
                "--set",
                f"api_token={S['flag_eq']}",
            ],
            tmp_path,
            env,
        ),
        lockstep(
            [
                "check",
                "determinism",
                "--script",
                "crash.py",
                "--nproc",
                "1",
                "--steps",
                "2",
                "--out",
                str(out / "check"),
                "--json",
                str(out / "check.json"),
            ],
            tmp_path,
            env,
        ),
    ]
    texts = {"terminal": "\n".join(terminal)}
    # Everything written under the working folder (wandb's run directory lands there too).
    for path in tmp_path.rglob("*"):
        if path.is_file() and path.name not in INPUTS and "__pycache__" not in path.parts:
            texts[str(path.relative_to(out if path.is_relative_to(out) else tmp_path))] = (
                path.read_bytes().decode("utf-8", "replace")
            )

    # The runs really happened and wrote what is searched.
    assert (out / "fp.json").is_file() and (out / "preflight.json").is_file(), terminal[:2]
    assert summary.is_file()
    assert any(name.endswith("metrics.jsonl") for name in texts), sorted(texts)
    assert any("wandb" in name for name in texts), (
        "\n".join(sorted(texts)) + texts["terminal"][-4000:]
    )
    assert "<redacted:" in texts["fp.json"]
    # The rank's exception and the crashing script's stderr were written, redacted.
    assert "ConnectionError: cannot reach https://<redacted:" in texts["terminal"], texts[
        "terminal"
    ][-6000:]
    run_log = texts[str(Path("check", "determinism-1", "run.log"))]
    assert "RuntimeError: cannot reach https://<redacted:" in run_log, run_log[-2000:]

    leaks = [
        f"{form} ({value!r}) in {name}"
        for name, text in texts.items()
        for form, value in SECRETS.items()
        if value in text and form != "pin"
    ]
    # The PIN is short enough to appear by chance in numbers: look for it as a whole token.
    leaks += [
        f"pin in {name}"
        for name, text in texts.items()
        if f"={PIN}" in text or f'"{PIN}"' in text or f": {PIN}" in text
    ]
    assert not leaks, "\n".join(leaks) + "\n\n" + texts["terminal"][-3000:]
