"""Planted secrets, as an attacker would look for them: one value per form, planted in the
environment, in config overrides, in a failing script's output, in a dataset that prints while
training, in exception text and tracebacks' source lines; then every output lockstep writes
(terminal, --json, the step summary, metrics.jsonl, the wandb run directory, check reports,
gate goldens and reports, the pytest plugin's reports and JUnit XML, error lines, an uncaught
traceback) is searched for every planted value.

One test on purpose: it runs the real commands once (fingerprint, a 2-rank preflight, a short
training, a training whose rank raises, a failing training override, a training whose import
fails, a check on a crashing script and on one that diverges, a gate golden and a comparison
with it, an inner pytest session of distributed tests) and reads everything. The preflight is
the one tests/preflight/test_preflight_ranks.py reads too, launched once (`support.planted`).
"""

from __future__ import annotations

import base64
import html
import json
import re
import subprocess
import sys
from pathlib import Path

from support.inprocess import run_main
from support.planted import (
    ENVIRON_LINE,
    FREE_TEXT,
    JOB_KEY,
    JSON_TEXT,
    PEM,
    PIN,
    SECRETS,
    SHAPES,
    SIGNED_URL,
    TOKEN,
    URL_PASSWORD,
    YAML,
    S,
    clean_environ,
    planted_preflight,
)

ROOT = Path(__file__).resolve().parents[1]

# Forms CI logs carry that leaked before: curl's user password, Docker's tokens, `wandb login`,
# a Kubernetes `.dockerconfigjson`, bare tokens (an `hf_` without a digit, an AWS session token,
# Telegram and Discord bots) and a private key's body without its BEGIN line.
DOCKER_AUTH = json.dumps(
    {"auths": {"ghcr.io": {"auth": base64.b64encode(b"ci:dock-6801").decode()}}}
)
CI = {
    "curl_u": "curl-pw-6802",
    "curl_user": "curl-pw-6803",
    "identitytoken": "idtok-pl4nted-6804",
    "registrytoken": "regtok-pl4nted-6805",
    "wandb_login": "6806" + "ab12cd34ef" * 3 + "567890",
    "dockerconfigjson": base64.b64encode(DOCKER_AUTH.encode()).decode(),
    "hf_letters": "hf_" + "PlantedHfLetters" * 2 + "Zz",
    "aws_session": "IQoJb3JpZ2luX2Vj" + "Pl4ntedSession" * 8,
    "telegram": "6807123:AAPl4ntedTelegramBotToken012345678",
    "discord": "MTA4MjQ1NjcxMjM0NTY3ODk5.Pl4ntd.Pl4ntedDiscordBotSecret6808",  # a bot's id, base64
    "key_line_1": "MIIEowIBAAKCAQEA" + "Pl4ntedKeyBody01" * 3,
    "key_line_2": "Pl4ntedKeyBody02" * 4,
    "key_line_3": "Pl4ntedKeyBodyEnd03==",
}
CI_FORMS = (  # on lines of their own, after whatever it is appended to
    f"\n+ curl -sSf -u ci-bot:{CI['curl_u']} https://artifacts.example.com/a\n"
    f"+ curl --user ci-bot:{CI['curl_user']} -O https://artifacts.example.com/b\n"
    "docker config "
    + json.dumps({"auths": {"r.io": {k: CI[k] for k in ("identitytoken", "registrytoken")}}})
    + f"\n+ wandb login {CI['wandb_login']}\n"
    f"  .dockerconfigjson: {CI['dockerconfigjson']}\n"
    f"via {CI['hf_letters']} aws {CI['aws_session']} bot {CI['telegram']} on {CI['discord']}\n"
    f"{CI['key_line_1']}\n{CI['key_line_2']}\n{CI['key_line_3']}\n"
)

CRASHING_SCRIPT = f"""
import os, sys
print({FREE_TEXT!r}, file=sys.stderr)
print({SIGNED_URL!r}, {JSON_TEXT!r}, file=sys.stderr)
print({SHAPES!r}, {YAML!r}, {CI_FORMS!r}, sep="\\n", file=sys.stderr)
MESSAGE = "cannot reach " + {FREE_TEXT!r} + " " + {PEM!r} + {CI_FORMS!r}
{ENVIRON_LINE}
"""

# A data factory whose source is unreachable: the exception is raised inside a rank, and
# torchelastic logs that rank's traceback from the launching process.
LEAKY_DATA = f"""
def data(seq_len, vocab_size):
    raise ConnectionError("cannot reach " + {FREE_TEXT!r} + " " + {SIGNED_URL!r} + " " + {PEM!r}
                          + {CI_FORMS!r})
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
MESSAGE = "cannot reach " + {SHAPES!r} + {CI_FORMS!r}
{ENVIRON_LINE}
"""
# A script whose two runs log different loss values holding secrets: the divergence is quoted.
DIVERGING_SCRIPT = f"""
import time
from lockstep import track
for step in range(1, 3):
    track.log(step, loss=f"{{time.time_ns()}} " + {SHAPES!r} + {CI_FORMS!r})
"""
# Distributed tests for the pytest plugin: output, a failing rank's traceback and message.
PLUGIN_TESTS = f"""
import os
import pytest

@pytest.mark.distributed(world_size=2)
def test_prints_and_fails(rank):
    print({SHAPES!r}, {FREE_TEXT!r}, {CI_FORMS!r})
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


def test_no_planted_secret_reaches_any_output(tmp_path, tmp_path_factory):
    out = tmp_path / "out"
    out.mkdir()
    summary = out / "step-summary.md"
    env = clean_environ(
        GITHUB_STEP_SUMMARY=str(summary), WANDB_MODE="offline", TORCH_CI_FORMS=CI_FORMS
    )
    preflight, preflight_out = planted_preflight(tmp_path_factory)
    for name, text in zip(
        INPUTS,
        (CRASHING_SCRIPT, LEAKY_DATA, CHATTY_DATA, LEAKY_IMPORT, DIVERGING_SCRIPT, PLUGIN_TESTS),
        strict=True,
    ):
        (tmp_path / name).write_text(text)
    cfg = str(ROOT / "smoke" / "cpu-ddp.toml")

    terminal = [
        lockstep(["fingerprint", "--json", str(out / "fp.json")], tmp_path, env),
        f"$ lockstep preflight -> {preflight.returncode}\n{preflight.stdout}{preflight.stderr}",
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
    # The preflight's files (its report, its step summary), in the folder it was launched in.
    texts["preflight.json"] = (preflight_out / "report.json").read_text()
    texts["preflight-summary.md"] = (preflight_out / "summary.md").read_text()

    # The runs really happened and wrote what is searched.
    assert (out / "fp.json").is_file() and preflight.returncode == 0, terminal[:2]
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

    planted = {**SECRETS, "token": TOKEN, "job_key": JOB_KEY, "url_password": URL_PASSWORD}
    planted.update({f"ci_{form}": value for form, value in CI.items()})
    leaks = [
        f"{form} ({value!r}) in {name}: ...{text[max(0, text.index(value) - 200) : text.index(value)]!r}"
        for name, text in texts.items()
        for form, value in planted.items()
        if value in text and form != "pin"
    ]
    # The PIN is short enough to appear by chance in numbers (a golden's `"rss": 4711...`):
    # look for it as a whole token, as a value.
    pin = re.compile(rf'(?:=|"|: ){PIN}(?![\w.])')
    leaks += [f"pin in {name}" for name, text in texts.items() if pin.search(text)]
    assert not leaks, "\n".join(leaks) + "\n\n" + texts["terminal"][-3000:]
