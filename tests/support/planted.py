"""Secrets planted as an attacker would look for them (tests/test_planted_secrets.py): one value
per form, and the environment that carries them into fingerprints; and `lockstep preflight
--nproc 2` launched with them planted, once per test run, for the tests that read its outputs
(tests/test_planted_secrets.py searches them for every planted value,
tests/preflight/test_preflight_ranks.py checks the verdict and the report): one launch for
both, not one each (two rank interpreters and a launching one fewer)."""

from __future__ import annotations

import base64
import json
import os
import subprocess
from pathlib import Path

from lockstep.launch.detect import LAUNCHER_VARIABLES
from support.inprocess import run_main
from support.once import once

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

# Planted only in the shared preflight (tests/preflight/test_preflight_ranks.py reads them).
TOKEN = "planted-secret-7f3a9"
JOB_KEY = "planted-job-key-" + "9e" * 16  # the operator's key: signs, never shown
URL_PASSWORD = "planted-url-pw-55c1"


def clean_environ(**extra: str) -> dict[str, str]:
    """This process's environment with no launcher variable another test may have left in
    it (a half-set launcher makes preflight exit 2 before it writes anything), nor a
    redaction key or salt, and with every planted value's variable (ENV)."""
    drop = {*LAUNCHER_VARIABLES, "LOCKSTEP_REDACT_KEY", "LOCKSTEP_REDACT_SALT"}
    base = {k: v for k, v in os.environ.items() if k not in drop}
    return dict(base, **ENV, **extra)


def planted_preflight(tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path]:
    """`lockstep preflight --nproc 2 --json report.json` with ENV, TOKEN, a proxy URL holding
    URL_PASSWORD and the job key JOB_KEY planted, GITHUB_STEP_SUMMARY at summary.md: its
    result and its folder (report.json, summary.md), launched once per test run."""

    def launch(folder: Path) -> None:
        env = clean_environ(
            GITHUB_STEP_SUMMARY=str(folder / "summary.md"),
            TORCH_PLANTED_TOKEN=TOKEN,
            NCCL_PLANTED_PROXY=f"http://bob:{URL_PASSWORD}@proxy:3128",
            LOCKSTEP_JOB_KEY=JOB_KEY,
        )
        argv = ["preflight", "--nproc", "2", "--timeout", "300"]
        proc = run_main([*argv, "--json", str(folder / "report.json")], folder, environ=env)
        result = {"returncode": proc.returncode, "stdout": proc.stdout, "stderr": proc.stderr}
        (folder / "result.json").write_text(json.dumps(result))

    folder = once(tmp_path_factory, "planted-preflight", launch)
    result = json.loads((folder / "result.json").read_text())
    return subprocess.CompletedProcess(["lockstep", "preflight"], **result), folder
