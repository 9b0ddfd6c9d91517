"""Planted secrets, as an attacker would look for them: one value per form, planted in the
environment, in config overrides, in a failing script's output, in a dataset that prints while
training, in exception text and tracebacks' source lines; then every output lockstep writes
(terminal, --json, the step summary, metrics.jsonl, the wandb run directory, check reports,
gate goldens and reports, the pytest plugin's reports and JUnit XML, error lines, an uncaught
traceback) is searched for every planted value.

One test on purpose: it runs the real commands once (fingerprint, a 2-rank preflight, a short
training, a training whose rank raises, a failing training override, a training whose import
fails, a check on a crashing script and on one that diverges, a gate golden and a comparison
with it, an inner pytest session of distributed tests) and reads everything.
"""

from __future__ import annotations

import base64
import html
import json
import os
import re
import subprocess
import sys
from pathlib import Path

from lockstep.launch.detect import LAUNCHER_VARIABLES
from support.inprocess import run_main

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
    # known token shapes, bare or under innocuous names (issue #27)
    "ghp": "ghp_" + "Pl4nt3dGh" * 4,
    "github_pat": "github_pat_11PLANTED0" + "Gh7" * 10,
    "hf": "hf_" + "Pl4ntedHf" * 4,
    "openai": "sk-proj-" + "Pl4ntedOa" * 4,
    "slack": "xoxb-2401-9327-Pl4ntedSlack",
    "gitlab": "glpat-" + "Pl4ntedGl" * 3,
    "aws": "AKIAPL4NTED0AWS7QXYZ",
    "jwt": "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJwbGFudGVkIn0.Pl4ntedJwtSig",
    "slack_hook": "T0PLANT/B0PLANT/slackHookPl4nted",
    "discord_hook": "987654321/discordHookPl4nted",
    "pw": "pw-val-8142",
    "pswd": "pswd-val-2290",
    "gh_pat": "gh-pat-val-6631",
    "job_jwt": "job-jwt-val-5120",
    "wandb_key": "0f1e2d3c4b5a69788796a5b4c3d2e1f0wandb7788",
    # structural forms
    "argv_repr": "argv-repr-tok-4410",
    "environ_src": "environ-src-tok-7712",
    "quoted_flag": "quoted flag-tok-3341",
    "short_flag": "short-flag-pw-9030",
    "set_nested": "set-nested-pw-1167",
    "config_repr": "config-repr-key-5561",
    "azure": "azureAccKey2251==",
    "yaml_rest": "yaml rest-of-line-8870",
    "yaml_block": "yaml-block-line-6618",
    "pin": PIN,
    # forms that still leaked (issue #37)
    "netrc": "netrc-pw-6120",
    "dapi": "dapi" + "a1b2c3d4e5f60718" * 2,
    "mysql": "mysql-pw-5533",
    "colon_pw": "colon-pw-7241",
    "ya29": "ya29.Pl4ntedGoogle" + "Tok3n" * 4,
    "sendgrid": "SG.Pl4ntedSendGrid01.Pl4ntedSendGridSecret02",
    "twilio": "SK" + "0f1e2d3c4b5a6978" * 2,
    "tab_pw": "tab-pw-3318",
    "urlenc": "urlenc-pw-9027",
    "basic_b64": base64.b64encode(b"alice:basic-pw-4471").decode(),
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
# The issue's forms, one line of prose (tokens bare and structural forms) and a YAML document.
SHAPES = (
    f"cloned with {S['ghp']} and {S['github_pat']}; model via {S['hf']}; llm {S['openai']}; "
    f"bot {S['slack']}; ci {S['gitlab']}; aws {S['aws']}; id {S['jwt']}; "
    f"https://hooks.slack.com/services/{S['slack_hook']} "
    f"https://discord.com/api/webhooks/{S['discord_hook']} "
    f"PW={S['pw']} DB_PSWD={S['pswd']} GH_PAT={S['gh_pat']} CI_JOB_JWT={S['job_jwt']} "
    f"wandb: ERROR Invalid API key {S['wandb_key']} "
    f"Command '['train', '--token', '{S['argv_repr']}']' failed; "
    f'run --token "{S["quoted_flag"]}" -p {S["short_flag"]} --set a=1,password={S["set_nested"]} '
    f"got Config(name='m', api_key='{S['config_repr']}') "
    f"DefaultEndpointsProtocol=https;AccountName=a;AccountKey={S['azure']};EndpointSuffix=x "
    f"machine api.ex.com login alice password {S['netrc']} token {S['dapi']} "
    f"mysql -u root -p{S['mysql']} db password:{S['colon_pw']} oauth {S['ya29']} "
    f"mail {S['sendgrid']} sms {S['twilio']} PASSWORD\t{S['tab_pw']} "
    f"next=%2Fa%3Fpassword%3D{S['urlenc']}%26b%3D1 auth {S['basic_b64']}"
)
YAML = (
    f"db:\n  password: {S['yaml_rest']}\n  secret: |\n    {S['yaml_block']}\n    more\n  host: h\n"
)
# A traceback's source line that assigns a secret (Python prints the raising line).
ENVIRON_LINE = f'os.environ["HF_TOKEN"] = "{S["environ_src"]}"; raise RuntimeError(MESSAGE)'

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
    "TORCH_SHAPES": SHAPES,
    "TORCH_YAML": YAML,
    "TORCH_PW": S["pw"],
    "NCCL_DB_PSWD": S["pswd"],
    "TORCH_GH_PAT": S["gh_pat"],
    "TORCH_CI_JOB_JWT": S["job_jwt"],
    # Names that are not secret: their values must survive (false positives, issue #27).
    "TORCH_ENV_KEY": "cpu-torch-survives",
    "TORCH_TOKENS_PER_S": "12345.5",
}

CRASHING_SCRIPT = f"""
import os, sys
print({FREE_TEXT!r}, file=sys.stderr)
print({SIGNED_URL!r}, {JSON_TEXT!r}, file=sys.stderr)
print({SHAPES!r}, {YAML!r}, sep="\\n", file=sys.stderr)
MESSAGE = "cannot reach " + {FREE_TEXT!r} + " " + {PEM!r}
{ENVIRON_LINE}
"""

# A data factory whose source is unreachable: the exception is raised inside a rank, and
# torchelastic logs that rank's traceback from the launching process.
LEAKY_DATA = f"""
def data(seq_len, vocab_size):
    raise ConnectionError("cannot reach " + {FREE_TEXT!r} + " " + {SIGNED_URL!r} + " " + {PEM!r})
"""
# A dataset that prints secrets while the run trains (wandb is recording by then). What it prints
# reaches the terminal as it is (README: a user's own output is not lockstep's); its lines are
# left out of the terminal's search, not out of wandb's files.
USER_PRINT = "user-print:"
CHATTY_DATA = f"""
import sys
import torch

class Chatty:
    def __init__(self, seq_len, vocab_size):
        self.seq_len, self.vocab_size = seq_len, vocab_size

    def __len__(self):
        return 64

    def __getitem__(self, i):
        if i < 2:  # the user's own prints: not lockstep's to redact on the terminal
            print({USER_PRINT!r}, {FREE_TEXT!r}, {SHAPES!r}, flush=True)
            print({USER_PRINT!r}, {SIGNED_URL!r}, repr({YAML!r}), file=sys.stderr, flush=True)
        return torch.arange(self.seq_len) % self.vocab_size

def data(seq_len, vocab_size):
    return Chatty(seq_len, vocab_size)
"""
# A module whose import fails in the lockstep process itself: an uncaught traceback.
LEAKY_IMPORT = f"""
import os
MESSAGE = "cannot reach " + {SHAPES!r}
{ENVIRON_LINE}
"""
# A script whose two runs log different loss values holding secrets: the divergence is quoted.
DIVERGING_SCRIPT = f"""
import time
from lockstep import track
for step in range(1, 3):
    track.log(step, loss=f"{{time.time_ns()}} " + {SHAPES!r})
"""
# Distributed tests for the pytest plugin: output, a failing rank's traceback and message.
PLUGIN_TESTS = f"""
import os
import pytest

@pytest.mark.distributed(world_size=2)
def test_prints_and_fails(rank):
    print({SHAPES!r}, {FREE_TEXT!r})
    if rank == 1:
        MESSAGE = {YAML!r}
        {ENVIRON_LINE}
"""
INPUTS = (
    "crash.py",
    "leaky_data.py",
    "chatty_data.py",
    "leaky_import.py",
    "diverge.py",
    "test_plugin_planted.py",
)


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
    for name, text in zip(
        INPUTS,
        (CRASHING_SCRIPT, LEAKY_DATA, CHATTY_DATA, LEAKY_IMPORT, DIVERGING_SCRIPT, PLUGIN_TESTS),
        strict=True,
    ):
        (tmp_path / name).write_text(text)
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
                "--set",
                "data.factory=chatty_data:data",
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
        lockstep(
            ["train", cfg, "--out", str(out / "uncaught"), "--set", "data.factory=leaky_import:d"],
            tmp_path,
            env,
        ),
        lockstep(
            [
                "check",
                "determinism",
                "--script",
                f"diverge.py --api-key {S['flag_space']}",
                "--nproc",
                "1",
                "--steps",
                "2",
                "--out",
                str(out / "diverge"),
                "--json",
                str(out / "diverge.json"),
            ],
            tmp_path,
            env,
        ),
        lockstep(
            [
                "gate",
                "record",
                "planted",
                cfg,
                "--nproc",
                "1",
                "--steps",
                "2",
                "--repeats",
                "2",
                "--run-path",  # forked ranks: the gate's own outputs, a torch import less each
                "--dir",
                str(out / "gates"),
                "--set",
                "logging.wandb=disabled",
                "--set",
                f"logging.run_name=a=1,password={S['set_nested']}",
                "--set",
                f"logging.project=Config(api_key='{S['config_repr']}')",
            ],
            tmp_path,
            env,
        ),
    ]
    goldens = sorted((out / "gates" / "planted").glob("*.json"))
    terminal.append(
        lockstep(
            [
                "gate",
                "compare",
                str(goldens[0]) if goldens else "missing-golden",
                str(out / "train" / "metrics.jsonl"),
                "--json",
                str(out / "gate.json"),
                "--junit",
                str(out / "gate-junit.xml"),
            ],
            tmp_path,
            env,
        )
    )
    # The pytest plugin, in a pytest session of its own: its report and its JUnit XML.
    plugin = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-rA",
            "test_plugin_planted.py",
            f"--junitxml={out / 'plugin-junit.xml'}",
            "-o",
            "lockstep_reuse_pool=false",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    terminal.append(f"$ pytest -> {plugin.returncode}\n{plugin.stdout}{plugin.stderr}")
    texts = {
        "terminal": "\n".join(
            line for line in "\n".join(terminal).splitlines() if not line.startswith(USER_PRINT)
        )
    }
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
    # The uncaught traceback was shown, its source line too, redacted.
    assert "RuntimeError: cannot reach cloned with <redacted:" in texts["terminal"]
    assert 'os.environ["HF_TOKEN"] = "<redacted:' in texts["terminal"], texts["terminal"][-6000:]
    # The diverging script's check wrote its report, and the gate its golden and its report.
    assert "step 1: loss" in texts["diverge.json"], texts["diverge.json"]
    assert goldens, texts["terminal"][-4000:]
    assert "lockstep gate: run 1/2" in texts["terminal"]
    golden = json.loads(goldens[0].read_text())
    report = json.loads(texts["gate.json"])
    assert "<redacted:" not in str(golden.get("env_key")) and "tokens_per_s" in texts["gate.json"]
    assert json.dumps(golden["env_key"]) in texts["gate.json"], "the env key must survive"
    assert report and "<redacted:" not in json.dumps(report.get("env_key", ""))
    # The plugin's run failed on rank 1 with the traceback, and its output was reported.
    assert "1 of 2 ranks failed: rank 1" in plugin.stdout, plugin.stdout[-4000:]
    assert "rank 0 output" in plugin.stdout and "plugin-junit.xml" in texts
    assert 'os.environ["HF_TOKEN"] = "<redacted:' in html.unescape(texts["plugin-junit.xml"])
    # wandb recorded no console output of its own (it would hold it raw).
    assert not [n for n in texts if n.endswith("output.log")], sorted(texts)
    # Names that are not secret keep their values.
    assert "cpu-torch-survives" in texts["fp.json"] and "12345.5" in texts["fp.json"]

    leaks = [
        f"{form} ({value!r}) in {name}: ...{text[max(0, text.index(value) - 200) : text.index(value)]!r}"
        for name, text in texts.items()
        for form, value in SECRETS.items()
        if value in text and form != "pin"
    ]
    # The PIN is short enough to appear by chance in numbers (a golden's `"rss": 4711...`):
    # look for it as a whole token, as a value.
    pin = re.compile(rf'(?:=|"|: ){PIN}(?![\w.])')
    leaks += [f"pin in {name}" for name, text in texts.items() if pin.search(text)]
    assert not leaks, "\n".join(leaks) + "\n\n" + texts["terminal"][-3000:]
