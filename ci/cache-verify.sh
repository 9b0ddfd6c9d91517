# shellcheck shell=bash
# Hash checks for the docker tier's cached tools, sourced by ci/docker-tier.sh (and run alone by
# tests/docker/test_cache_verify.py). A cached file is checked on every use, not only when it
# was downloaded or made: a truncated, corrupted or swapped cache entry stops the tier.
#
#   verify_pinned FILE SHA256     FILE's sha256 is the pinned one (a download: buildx's .deb)
#   record_sha256 FILE            write FILE.sha256 next to FILE (a thing made here: the rootfs)
#   verify_recorded FILE          FILE matches FILE.sha256; status 2 when there is no record
#
# A record beside the file guards against corruption and partial writes, not against someone
# who can write to the cache (they can rewrite the record too); pinned hashes guard against both.
# Each prints one line on failure and returns non-zero; the caller decides whether to die.

sha256_of() { sha256sum "$1" | cut -d' ' -f1; }

verify_pinned() { # FILE SHA256
	local file=$1 want=$2 got
	[[ -f $file ]] || {
		echo "cache-verify: $file is missing" >&2
		return 1
	}
	got=$(sha256_of "$file")
	[[ $got == "$want" ]] || {
		echo "cache-verify: $file has sha256 $got, pinned $want" >&2
		return 1
	}
}

record_sha256() { # FILE
	sha256_of "$1" >"$1.sha256.partial" && mv "$1.sha256.partial" "$1.sha256"
}

verify_recorded() { # FILE
	local file=$1 want
	[[ -f $file.sha256 ]] || {
		echo "cache-verify: $file has no recorded sha256 ($file.sha256)" >&2
		return 2
	}
	want=$(<"$file.sha256")
	[[ $want =~ ^[0-9a-f]{64}$ ]] || {
		echo "cache-verify: $file.sha256 holds no sha256" >&2
		return 1
	}
	verify_pinned "$file" "$want"
}
