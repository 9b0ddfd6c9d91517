"""`lockstep.redact.scrub_text` on inputs of 1x, 2x, 4x and 8x a base size, per shape: the
time of each and its ratio to the one before (linear: about 2 per doubling; quadratic: 4).

Shapes: one line of URLs (`http://h1:80/N`, the issue's 60 KB line of 4,000 URLs at 1x, which
took 0.9 s before the scrub was made linear, 4x per doubling) ending in an `@` before no host; a line of URLs with user:password credentials; a
log of 80-column lines holding every form once per line; a long `a=a=a=...` chain; YAML with
secret block scalars; one line of quoted names without values; the forms issue #37 added,
each on one long line (a MySQL command, .netrc tokens, base64 runs, `name:`, tabs and `%3D`);
the forms CI logs carry (base64 JSON, keys' bodies without BEGIN, curl's `-u`, `wandb login`);
and the log of every form again, streamed through `LineScrubber` in 4 KB writes (a kept log).

    .venv/bin/python benchmarks/bench_redact.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import base64
import itertools
import time


def shapes(scale: int) -> dict[str, str]:
    urls = " ".join(f"http://h{i % 10}:80/{i}" for i in range(4000 * scale))
    creds = " ".join(f"https://u{i}:pw{i}@h.example.com/p" for i in range(2000 * scale))
    line = (
        "API_KEY=kv-1 --token t-2 password: a b 'tok', 'x' https://u:p@h/x ghp_"
        + "a1" * 18
        + " tokens_per_s=3.5 sha256:"
        + "ab" * 32
    )
    json64 = base64.b64encode(b'{"auths": {"r.io": {"auth": "dTpw"}}, "n": 1}').decode()
    key = "MIIEowIBAAKCAQEA" + "Q" * 48 + ("\n" + "R" * 64) * 12 + "\nSSSS=="
    curl = "curl -u u:pw-1 --user u:pw-2 https://h/x && wandb login " + "ab12" * 10
    yaml = "\n".join(
        f"k{i}: 1\nsecret: |\n  line {i}\n  more\nhost: h:1" for i in range(400 * scale)
    )
    return {
        "urls (1 line)": urls + " @ end",
        "url credentials (1 line)": creds,
        "log of every form": "\n".join([line] * (500 * scale)),
        "a=a=a chain": "a=" * (30_000 * scale),
        "yaml blocks": yaml,
        "quoted names": "'k', " * (12_000 * scale),
        # issue #37's forms, each at its worst: one long line
        "mysql ... -p (1 line)": "mysql -u x " * (6_000 * scale) + "-pS3cret",
        "netrc machine (1 line)": "machine h login u " * (4_000 * scale),
        "base64 runs (1 line)": ("QUJD" * 50 + "- ") * (300 * scale),
        "name:value chain": "password:" * (8_000 * scale),
        "name<TAB> and %3D": "token\t" * (6_000 * scale) + "password%3D" * (6_000 * scale),
        # the forms CI logs carry, at their worst
        "base64 JSON runs (1 line)": (json64 + " ") * (300 * scale),
        "key bodies, no BEGIN": "\n".join([key] * (100 * scale)),
        "curl -u, wandb login": "\n".join([curl] * (800 * scale)),
        "streamed log of every form": "\n".join([line] * (500 * scale)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="best of N runs (default 3)")
    args = parser.parse_args()

    from lockstep.redact import LineScrubber, scrub_text

    def streamed(text: str) -> None:
        data, scrubber = text.encode(), LineScrubber()
        for i in range(0, len(data), 4096):
            scrubber.feed(data[i : i + 4096])
        scrubber.close()

    print(f"{'shape':26} {'size':>9} {'1x':>9} {'2x':>9} {'4x':>9} {'8x':>9}  ratios")
    for name in shapes(1):
        times, size = [], 0
        for scale in (1, 2, 4, 8):
            text = shapes(scale)[name]
            size = size or len(text)
            best = float("inf")
            for _ in range(args.repeat):
                start = time.perf_counter()
                (streamed if name.startswith("streamed") else scrub_text)(text)
                best = min(best, time.perf_counter() - start)
            times.append(best)
        ratios = " ".join(f"{b / a:.1f}" for a, b in itertools.pairwise(times))
        cells = " ".join(f"{t * 1000:7.1f}ms" for t in times)
        print(f"{name:26} {size / 1024:7.0f}KB {cells}  {ratios}")


if __name__ == "__main__":
    main()
