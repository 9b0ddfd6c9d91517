"""Secrets never leave the process: secret names, and every form free text carries them in."""

import ast
import base64
import hashlib
import itertools
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from lockstep.redact import (
    escape_controls,
    fingerprint_of,
    is_secret_name,
    redact_mapping,
    redact_value,
    scrub_argv,
    scrub_text,
    scrubbed_log,
)

ROOT = Path(__file__).resolve().parents[1]


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
    # the HMAC shown may hold the secret's digits by chance ("<redacted:8ad06048af999907>")
    assert secret not in re.sub(r"<redacted:[0-9a-f]{16}>", "<redacted>", out), out
    assert "<redacted:" in out, out


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


# Known token shapes, under innocuous names or bare in prose (each value is the secret).
GHP = "ghp_" + "R2d2C3po" * 4 + "x9Yz"
SHAPES = {
    "github": GHP,
    "github_pat": "github_pat_11AAAAAAA0" + "b7" * 20,
    "huggingface": "hf_" + "QwErTy12" * 4 + "zz",
    "openai": "sk-proj-" + "Ab3dEf6h" * 5,
    "slack": "xoxb-2401-9327-" + "kQ8pZ3mW" * 3,
    "gitlab": "glpat-" + "x7Y8z9W0v1" * 2,
    "aws": "AKIA" + "Q2W3E4R5T6Y7U8I9",
    "jwt": "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJjaS1qb2IifQ.S1gnatur3-Of_the-t0ken",
}


@pytest.mark.parametrize("kind", sorted(SHAPES))
@pytest.mark.parametrize("template", ["note={}", "bare {} in prose", "'{}'", "see ({})"])
def test_known_token_shapes_are_redacted_wherever_they_stand(kind, template):
    out = scrub_text(template.format(SHAPES[kind]))
    assert SHAPES[kind] not in out and "<redacted:" in out, out


@pytest.mark.parametrize(
    ("text", "secret"),
    [
        ("https://hooks.slack.com/services/T0001/B0002/slackHookS3cret", "slackHookS3cret"),
        ("https://discord.com/api/webhooks/1234567/discordHookS3cret", "discordHookS3cret"),
        ("PW=pw-1 next", "pw-1"),
        ("DB_PSWD=pswd-2", "pswd-2"),
        ("GH_PAT=pat-3", "pat-3"),
        ("CI_JOB_JWT=jwt-4", "jwt-4"),
        ("SLACK_WEBHOOK_URL=hook-5", "hook-5"),
        ("wandb: ERROR Invalid API key 0123456789abcdef0123456789abcdef01234567", "0123456789"),
        ("Command '['train', '--token', 'argv-6']' returned 1", "argv-6"),
        ("os.environ.setdefault('HF_TOKEN', 'env-7')", "env-7"),
        ('    os.environ["HF_TOKEN"] = "env-8"', "env-8"),
        ('run --token "a b8c9"', "b8c9"),
        ("mysql -u root -p pw-10 db", "pw-10"),
        ("lockstep train c.toml --set a=1,password=pw-11", "pw-11"),
        ("ValueError: bad Config(name='x', api_key='key-12')", "key-12"),
        ("--set model=Config(api_key=key-13)", "key-13"),
        ("Endpoint=https;AccountName=a;AccountKey=az-14==;EndpointSuffix=x", "az-14"),
        ("password: a b15 c16", "b15"),
        ("password: a b15 c16", "c16"),
        ("db:\n  secret: |\n    line-17\n    line-18\n  host: h\n", "line-18"),
        ("secret: >-\n  folded-19\n", "folded-19"),
        ('{"api_key": 12345678, "n": 1}', "12345678"),
        # issue #37: forms that still leaked
        ("machine api.wandb.ai login alice password netrc-20 ", "netrc-20"),
        ("machine h\n  login alice\n  password netrc-21\n", "netrc-21"),
        ("token dapi0123456789abcdef0123456789abcdef-2 used", "0123456789abcdef"),
        ("mysql -u root -pmysql-22 db", "mysql-22"),
        ("mysqldump --user=u -pmysql-23 db > out.sql", "mysql-23"),
        ("connect failed password:colon-24 retry", "colon-24"),
        ("oauth ya29.a0AfH6SMBxGoogle25Tokenabcdef", "Google25Token"),
        ("key SG.sendgrid26abcdefghij.abcdefghijklmnopqrstuvwxyz0123", "sendgrid26"),
        ("twilio SK0123456789abcdef0123456789abcd27 ok", "abcdef0123456789abcd27"),
        ("PASSWORD\ttab-28\n", "tab-28"),
        ("GET /login?next=%2Fhome%3Fpassword%3Durl-29%26a%3D1", "url-29"),
        ("hdr " + base64.b64encode(b"alice:basic-30").decode() + " end", "YmFzaWMtMzA"),
    ],
)
def test_forms_that_leaked_are_scrubbed(text, secret):
    out = scrub_text(text)
    # the HMAC shown may hold the secret's digits by chance ("<redacted:8ad06048af999907>")
    assert secret not in re.sub(r"<redacted:[0-9a-f]{16}>", "<redacted>", out), out
    assert "<redacted:" in out, out


def test_a_yaml_block_keeps_its_shape_and_what_follows():
    text = "db:\n  secret: |\n    line-17\n\n    line-18\n  host: gpu-3\nport: 1\n"
    out = scrub_text(text)
    assert out.startswith("db:\n  secret: |\n    <redacted:") and out.count("<redacted:") == 1
    assert out.endswith(">\n  host: gpu-3\nport: 1\n"), out


@pytest.mark.parametrize(
    "text",
    [
        "tokens=4096 tokens_per_s=1234.5 num_tokens: 7 max_new_tokens=20",
        "env_key=linux-x86_64/py3.11/torch2.13 sort_key=loss ssh_public_key=AAAA",
        "image ghcr.io/acme/train@sha256:" + "0f" * 32,
        "pulled https://registry.example.com:5000/acme/train@sha256:" + "0f" * 32,
        "sha256:" + "ab" * 32 + " param_digest=9f86d081884c7d65",
        "rendezvous auth.example.com:29500 and session-host.internal:443 are up",
        "KeyError: 'HF_TOKEN' (set it)",
        "mkdir -p /tmp/out && pytest -p no:cacheprovider && docker run -p 8080:80 img",
        "git rev 4b825dc642cb6eb9a060e54bf8d69288fbee4904 hf_hub_download ghp_short",
        # issue #37: lockstep's own text that the forms damaged
        '        key = f"{pg[0]} {pg[1]}"',
        "    token = make_token(rank)",
        'gcc -pthread -pipe -O2 && mkdir -p "$S/bin" "$S/head/tmp"',
        "Authorization headers and bearer tokens, secret query parameters",
        "No silent pass: when no golden exists the answer is exit 2",
        "64 bits of HMAC under the job's or the user's key: equal values give equal text.",
        "Among {env key: key fields} the key whose fields differ least.",
        "lockstep train c.toml --set KEY=VALUE, `--set key=value`, `--set api_token=...`",
        "AuthType=auth/munge\nAuthInfo=socket=/run/munge/munge.socket.2\n",
        "--token-command 'gh api -X POST repos/o/r/actions/runners/registration-token'",
        "LOCKSTEP_JOB_KEY_FILE=/run/secrets/lockstep-key",
        "token: HF_TOKEN\npassword: ${{ secrets.DB_PASSWORD }}",
        # base64 that is no `user:secret`: a digest, a word
        "sha256-n4bQgYhMfWWaL+qgxVrQFaO/TxsrC4Is0V1sFbDwCgg= dGVzdGluZzEyMzQ1Ng==",
    ],
)
def test_what_is_not_secret_survives(text):
    assert scrub_text(text) == text


def test_a_gate_reports_fields_survive_redaction():
    data = {
        "env_key": "cpu/torch-2.13",
        "tokens": 4096,
        "tokens_per_s": 12.5,
        "digest": "sha256:0f",
    }
    assert redact_mapping(data) == data


def test_redacted_json_stays_json():
    import json

    text = json.dumps({"api_key": None, "token": 1234, "password": "x y", "ok": True, "n": [1]})
    out = scrub_text(text)
    assert json.loads(out)["api_key"] is None and "x y" not in out and "1234" not in out
    assert json.loads(out)["token"].startswith("<redacted:")
    assert scrub_text("Config({'token': None})") == "Config({'token': None})"


def test_a_secret_in_a_json_string_keeps_the_json_valid():
    import json

    text = json.dumps({"log": "password: a b c", "cmd": "run --token 'q r' -x", "n": 1})
    out = json.loads(scrub_text(text))
    assert out["n"] == 1 and "b c" not in out["log"] and "q r" not in out["cmd"]


def test_short_password_flags_and_nested_sets_in_a_command_line():
    argv = ["mysql", "-p", "pw-20", "--set", "a=1,password=pw-21", "mkdir", "-p", "/tmp/x"]
    clean = scrub_argv(argv)
    assert "pw-20" not in " ".join(clean) and "pw-21" not in " ".join(clean)
    assert clean[-2:] == ["-p", "/tmp/x"] and clean[4].startswith("a=1,password=<redacted:")


def test_the_same_secret_shows_the_same_digest_in_every_form():
    """A token pasted bare and the same token under a name: one digest, so comparisons hold."""
    bare = scrub_text(f"cloned with {GHP}")
    named = scrub_text(f"GITHUB_TOKEN={GHP}")
    assert bare.split("<redacted:")[1] == named.split("<redacted:")[1]


def test_quoted_values_inside_reprs_json_and_shell_quoting():
    import json
    import shlex

    texts = [
        repr("Command '['train', '--token', 'argv-30']' failed\" Config(api_key='cfg-31')"),
        json.dumps({"cmd": 'run --token "q 32" API_KEY="k 33"'}),
        "--set " + shlex.quote("logging.project=Config(api_key='cfg-34', n='a')"),
    ]
    for text, secrets in zip(
        texts, [("argv-30", "cfg-31"), ("q 32", "k 33"), ("cfg-34",)], strict=True
    ):
        out = scrub_text(text)
        assert not any(s in out for s in secrets) and "<redacted:" in out, out
    assert json.loads(scrub_text(texts[1]))["cmd"].startswith('run --token "<redacted:')


def test_a_verdict_line_is_not_a_password():
    line = "### lockstep preflight: PASS: 2 ranks on 1 node, torchelastic, gloo, 0.293 s"
    assert scrub_text(line) == line
    assert "hunter2" not in scrub_text("PASS=hunter2 DB_PASS: hunter2")


def test_a_secret_name_as_a_json_value_does_not_take_the_next_key():
    text = '{"field": "env.HF_TOKEN", "value": "<redacted:00>", "expected": "x"}'
    assert scrub_text(text) == text
    assert "hunter2" not in scrub_text("['--token', 'hunter2']")


def literals(path: Path) -> list[str]:
    """Every string literal of a Python file (f-strings' constant parts too)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [
        n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
    ]


def test_lockstep_s_own_text_survives_redaction():
    """Every string literal in src/lockstep (its messages, docstrings, scripts and configs) and
    every example block of the docs comes out of scrub_text unchanged: a false positive damages
    lockstep's own output (issue #37)."""
    damaged = []
    for path in sorted((ROOT / "src" / "lockstep").rglob("*.py")):
        damaged += [
            f"{path.relative_to(ROOT)}: {s[:80]!r}" for s in literals(path) if scrub_text(s) != s
        ]
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        blocks = re.findall(r"```[^\n]*\n(.*?)```", path.read_text(encoding="utf-8"), re.S)
        damaged += [f"{path.relative_to(ROOT)}: {b[:80]!r}" for b in blocks if scrub_text(b) != b]
    assert not damaged, "\n".join(damaged)


@pytest.mark.parametrize(
    ("name", "shown"),
    [
        ("loss", "loss"),
        ("loss\x1b[2J\x1b[31m", "loss\\x1b[2J\\x1b[31m"),
        ("a\nPASS: forged", "a\\nPASS: forged"),
        ("tab\there\r", "tab\\there\\r"),
        ("grad_norm/\u00e9t\u00e9", "grad_norm/\u00e9t\u00e9"),
    ],
)
def test_control_characters_in_names_are_shown_escaped(name, shown):
    assert escape_controls(name) == shown


def test_the_job_key_is_scrubbed_by_its_value_wherever_it_stands(monkeypatch, tmp_path):
    """Preflight's job key, from LOCKSTEP_JOB_KEY or its file, leaves no output even in text
    with no secret-looking name beside it (a bare value in an error line or a log)."""
    from lockstep.preflight import job_key

    from_env, from_file = "e1" * 20, "f2" * 20
    monkeypatch.setenv("LOCKSTEP_JOB_KEY", from_env)
    assert from_env not in scrub_text(f"store said {from_env}!")
    monkeypatch.delenv("LOCKSTEP_JOB_KEY")
    key_file = tmp_path / "key"
    key_file.write_text(from_file + "\n")
    key_file.chmod(0o600)
    assert job_key.load({"LOCKSTEP_JOB_KEY_FILE": str(key_file)}) == from_file.encode()
    text = scrub_text(f"value {from_file} in a log line")
    assert from_file not in text and "<redacted:" in text


def key_body(der_head: bytes, size: int = 600, wrap: int = 64) -> str:
    """A private key's PEM body without its BEGIN line: its DER's first bytes, then bytes of
    no meaning (deterministic), in base64 lines of `wrap` characters."""
    filler = b"".join(hashlib.sha256(str(i).encode()).digest() for i in range(size // 32 + 1))
    text = base64.b64encode(der_head + filler[:size]).decode()
    return "\n".join(text[i : i + wrap] for i in range(0, len(text), wrap))


RSA_HEAD = bytes.fromhex("308204a30201000282010100")  # PKCS#1 RSA, version 0
EC_HEAD = bytes.fromhex("307702010104")  # SEC1 EC P-256, version 1
PKCS8_HEAD = bytes.fromhex("308204be020100300d06092a")  # PKCS#8
DOCKER_CONFIG = json.dumps(
    {"auths": {"ghcr.io": {"auth": base64.b64encode(b"ci:dock-pw-41").decode()}}}
)
DISCORD_ID = base64.b64encode(b"108245671234567890").decode()  # a bot's token opens with it
SESSION_TOKEN = "IQoJb3JpZ2luX2VjEJr//////////wEaCXVzLWVhc3QtMSJHMEUCIQ" + "Dk9xQ1" * 40


@pytest.mark.parametrize(
    ("text", "secret"),
    [
        ("+ curl -sSf -u ci-bot:curl-pw-31 https://artifacts.example.com/x", "curl-pw-31"),
        ("curl --user ci-bot:curl-pw-32 -O https://h/x", "curl-pw-32"),
        ("curl --user='ci-bot:curl pw 33' https://h/x", "pw 33"),
        ("curl -uci-bot:curl-pw-34 https://h/x", "curl-pw-34"),
        ("curl -x proxy:3128 -U bob:proxy-pw-35 https://h/x", "proxy-pw-35"),
        ('{"auths": {"r.io": {"identitytoken": "idtok-36-abc"}}}', "idtok-36-abc"),
        ('{"registrytoken": "regtok-37-abc"}', "regtok-37-abc"),
        ("+ wandb login 0123456789abcdef0123456789abcdef01234567", "0123456789abcdef"),
        ("wandb login --relogin --host https://w.example.com " + "9f" * 20, "9f9f9f9f"),
        (
            ".dockerconfigjson: " + base64.b64encode(DOCKER_CONFIG.encode()).decode(),
            base64.b64encode(DOCKER_CONFIG.encode()).decode()[:40],
        ),
        (
            '{"data": {".dockerconfigjson": "'
            + base64.b64encode(DOCKER_CONFIG.encode()).decode()
            + '"}}',
            base64.b64encode(DOCKER_CONFIG.encode()).decode()[20:60],
        ),
        ("model via hf_" + "QwErTyUiOpAsDfGhJkLzXcVbNmQwErTyUi" + " ok", "QwErTyUiOpAsDfGh"),
        ("export creds " + SESSION_TOKEN + " done", SESSION_TOKEN[20:80]),
        ("FwoGZXIvYXdzEBYaDH" + "Kq7x" * 40, "Kq7xKq7xKq7x"),
        ("ssh key:\n" + key_body(RSA_HEAD) + "\nnext step", key_body(RSA_HEAD)[-40:]),
        ("key " + key_body(EC_HEAD, 100) + "\n", key_body(EC_HEAD, 100)[-30:]),
        (json.dumps({"k": key_body(PKCS8_HEAD)}), key_body(PKCS8_HEAD)[-40:]),
        ("notify 110201543:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsawXy done", "AAHdqTcvCH1vGWJx"),
        (
            "POST https://api.telegram.org/bot110201543:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsa/send",
            "dqTcvCH1",
        ),
        ("discord " + DISCORD_ID + ".GhIjKl.Abc1Def2Ghi3Jkl4Mno5Pqr6Stu7Vw", "Abc1Def2Ghi3"),
    ],
)
def test_forms_ci_logs_carry_are_scrubbed(text, secret):
    out = scrub_text(text)
    assert secret not in re.sub(r"<redacted:[0-9a-f]{16}>", "<redacted>", out), out
    assert "<redacted:" in out, out


@pytest.mark.parametrize(
    "text",
    [
        "HEAD is now at 4b825dc642cb6eb9a060e54bf8d69288fbee4904 fix: tokens",
        "torch==2.5.1 \\\n    --hash=sha256:" + "0a1b" * 16 + " \\\n    --hash=sha256:" + "9f" * 32,
        "digest 3f786850e387550fdab836ed7e6dc881de23001b",  # a bare 40-hex, no secret near
        "docker run -u 1000:1000 --user 1000:1000 img && python -u train.py && pip install -U x",
        "wandb login --relogin --host https://wandb.example.com",
        "wandb: Appending key for api.wandb.ai to your netrc file: /root/.netrc",
        "hf_hub_download hf_transfer_is_enabled_for_the_run",
        # public material: a certificate's and a public key's bodies, a JSON base64 with no secret
        "MIIBbjCCAROgAwIBAgIUUcml0lNe3pdJ4msA5eEKDW+Wng0wCgYIKoZIzj0EAwIw",
        "MCowBQYDK2VwAyEA/JX6UaRe+2aRO1Dq8yfhSJwbSdKDTjca1LqyZbb2nZo=",
        "cfg " + base64.b64encode(b'{"auths": {"ghcr.io": {}}, "n": 1}').decode(),
    ],
)
def test_what_stays_readable_in_ci_logs(text):
    assert scrub_text(text) == text
