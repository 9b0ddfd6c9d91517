"""A kept run log is scrubbed as it is written (`lockstep.redact.stream`): created 0600, each
line scrubbed before it reaches the disk, a secret split across writes or spanning lines (a
private key, a YAML block, a name whose value opens the next line) held back until complete,
so that a lockstep SIGKILLed in the middle of one leaves no secret on disk."""

from __future__ import annotations

import os
import random
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lockstep.redact import LineScrubber, scrub_text, scrubbed_log, scrubbing_fifo

BODY = [  # a private key's body: the DER of a PKCS#1 RSA key begins so, the rest is filler
    "MIIEowIBAAKCAQEAu1SU1LfVLPHCozMxH2Mo4lgOEePzNm0tRgeLezV6ffAt0gun",
    "VTLw7onLRnrq0/IzW7yWR7QkrmBL7jTKEn5u+qKhbwKfBstIs+bMY2Zkp18gnTxK",
    "LxoS2tFczGkPLPgizskuemMghRniWaoLcyehkd3qqGElvW/VDL5AaWTg0nLVkjRo",
    "9z+40RQzuVaE8AkAFmxZzow3x+VJYKdjykkJ0iT9wCS0DRTXu269V264Vf/3jvre",
    "dGhpcyBpcyBub3QgYSByZWFsIGtleQ==",
]
PEM = "-----BEGIN RSA PRIVATE KEY-----\n" + "\n".join(BODY) + "\n-----END RSA PRIVATE KEY-----\n"
SECRET_BITS = [line[16:48] for line in BODY]  # what must never be on disk

MULTI_LINE = {
    "key": f"epoch 1\n{PEM}epoch 2\n",
    "body without BEGIN": "loaded:\n" + "\n".join(BODY) + "\nepoch 2\n",
    "yaml block": "db:\n  secret: |\n    line-17\n\n    line-18\n  host: gpu-3\nport: 1\n",
    "name ending a line": "run --token\n\ntok-val-19\ndone\n",
    "json key, value below": '{"password":\n  "pw-val-20", "n": 1}\n',
    "split within a line": "café API_KEY=kv-s3cret-21 → https://u:pw-val-22@h.example.com/x\n",
    "unterminated": "last words API_KEY=kv-val-23",
    "name at a line's end, =": "export API_KEY=\n  kv-val-24\n",
}


def stream(text: str, sizes, hold_max: int | None = None) -> str:
    scrubber = LineScrubber() if hold_max is None else LineScrubber(hold_max)
    data, out, i = text.encode(), b"", 0
    for n in sizes:
        out += scrubber.feed(data[i : i + n])
        i += n
    return (out + scrubber.feed(data[i:]) + scrubber.close()).decode()


@pytest.mark.parametrize("name", sorted(MULTI_LINE))
def test_streamed_text_is_scrubbed_as_the_whole_text_would_be(name):
    """However the writes cut it (a byte at a time, random pieces, one write), the stream
    writes what scrub_text makes of the whole text."""
    text, rng = MULTI_LINE[name], random.Random(name)
    whole = scrub_text(text)
    assert whole != text
    for sizes in ([1] * len(text.encode()), [len(text.encode())], *(
            [rng.randint(1, 9) for _ in range(len(text))] for _ in range(20))):  # fmt: skip
        assert stream(text, sizes) == whole


def test_a_key_is_held_back_until_its_end_line():
    scrubber = LineScrubber()
    head, rest = PEM.split(BODY[2])
    written = scrubber.feed(b"epoch 1\n" + head.encode())
    assert written == b"epoch 1\n"  # the key's lines wait, the line before does not
    written += scrubber.feed((BODY[2] + rest + "epoch 2\n").encode())
    assert written.startswith(b"epoch 1\n<redacted:") and written.endswith(b">\nepoch 2\n")
    assert not any(bit.encode() in written for bit in SECRET_BITS)


@pytest.mark.parametrize("begin", [True, False], ids=["with BEGIN", "body alone"])
def test_a_secret_longer_than_the_hold_is_written_redacted_line_by_line(begin):
    lines = [BODY[0], *[BODY[1]] * 40, BODY[-1]]  # 2.7 KB of key with a 1 KB hold
    if begin:
        lines = ["-----BEGIN PRIVATE KEY-----", *lines, "-----END PRIVATE KEY-----"]
    text = "start\n" + "\n".join(lines) + "\nafter the key\n"
    out = stream(text, [500] * 20, hold_max=1024)
    assert not any(bit in out for bit in SECRET_BITS), out
    assert out.startswith("start\n<redacted:") and out.endswith(">\nafter the key\n"), out


def test_a_line_that_never_ends_is_written_past_the_hold():
    scrubber = LineScrubber(hold_max=1000)
    assert scrubber.feed(b"step 1/9\r" * 100) == b""  # a progress bar's updates, no newline
    assert scrubber.feed(b"step 2/9\r" * 100) == b"step 1/9\r" * 100 + b"step 2/9\r" * 100
    assert scrubber.feed(b"API_KEY=kv-val-25\n").startswith(b"API_KEY=<redacted:")


def test_a_kept_log_is_0600_and_scrubbed_while_the_writer_still_runs(tmp_path):
    log, go_on = tmp_path / "run.log", tmp_path / "go-on"
    child = (
        "import os, sys, time\n"
        "print('API_KEY=kv-s3cret-31 https://u:pw-val-32@h.example.com/x', flush=True)\n"
        f"while not os.path.exists({str(go_on)!r}): time.sleep(0.05)\n"
        "print('done', flush=True)\n"
    )
    with scrubbed_log(log) as out:
        proc = subprocess.Popen([sys.executable, "-c", child], stdout=out, stderr=out)
        deadline = time.monotonic() + 30
        while "API_KEY=" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        during = log.read_text()
        go_on.touch()
        proc.wait(timeout=30)
    assert during.startswith("API_KEY=<redacted:") and "https://<redacted:" in during, during
    assert "kv-s3cret-31" not in during and "pw-val-32" not in during
    assert log.read_text() == during + "done\n"
    assert stat.S_IMODE(log.stat().st_mode) == 0o600


def test_a_pipe_outlived_by_a_writer_ends_with_the_block(tmp_path):
    """A writer that keeps the pipe open (a rank's orphan) does not hold the block's end."""
    log = tmp_path / "run.log"
    started = time.monotonic()
    with scrubbing_fifo(log) as fifo:
        holder = subprocess.Popen(
            [sys.executable, "-c", f"import time; f = open({str(fifo)!r}, 'w'); time.sleep(60)"]
        )
        with open(fifo, "wb") as out:
            out.write(b"token: tok-val-41\n")
    holder.kill()
    holder.wait()
    assert time.monotonic() - started < 20
    assert log.read_text().startswith("token: <redacted:")
    assert not Path(fifo).exists()


KEY_HEAD = "-----BEGIN RSA PRIVATE KEY-----\n" + "\n".join(BODY[:3]) + "\n"
KEY_SCRIPT = f"""\
import sys, time
from pathlib import Path
print("before the key", flush=True)
sys.stderr.write({KEY_HEAD!r})
sys.stderr.flush()
Path(sys.argv[1]).write_text("written")
time.sleep(120)
"""


def test_a_sigkilled_lockstep_in_the_middle_of_a_key_leaves_no_secret_on_disk(tmp_path):
    script, mark, out = tmp_path / "key.py", tmp_path / "mark", tmp_path / "runs"
    script.write_text(KEY_SCRIPT)
    (tmp_path / "tmp").mkdir()
    env = dict(os.environ, TMPDIR=str(tmp_path / "tmp"), LOCKSTEP_FIRST_STEP_TIMEOUT="600")
    argv = [sys.executable, "-m", "lockstep", "check", "determinism", "--script",
            f"{script} {mark}", "--nproc", "1", "--out", str(out)]  # fmt: skip
    proc = subprocess.Popen(argv, cwd=tmp_path, env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    log = out / "determinism-1" / "run.log"
    try:
        deadline = time.monotonic() + 120
        while not (mark.exists() and log.exists() and "before the key" in log.read_text()):
            assert proc.poll() is None and time.monotonic() < deadline, "the script never ran"
            time.sleep(0.05)
        time.sleep(1.0)  # the key's lines are in lockstep's hands by now
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    found = {}
    for path in tmp_path.rglob("*"):
        if path.is_file() and path not in (script, mark):  # regular files: a pipe has no data
            text = path.read_bytes().decode("utf-8", "replace")
            found.update({f"{path}: {bit}": 1 for bit in SECRET_BITS if bit in text})
    assert not found, sorted(found)
    assert stat.S_IMODE(log.stat().st_mode) == 0o600
    assert log.read_text().startswith("before the key\n"), log.read_text()
