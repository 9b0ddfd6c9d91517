#!/usr/bin/env bash
# Set up one self-hosted GPU runner for lockstep (docs/gpu-runners.md says why each step).
#
#   sudo ci/setup-gpu-runner.sh --url https://github.com/OWNER/REPO --group gpu \
#       --runner-version 2.330.0 --runner-sha256 <sha256 of actions-runner-linux-x64-*.tar.gz> \
#       --token-command 'gh api -X POST repos/OWNER/REPO/actions/runners/registration-token --jq .token'
#
# Checks the host (driver, Docker, NVIDIA container toolkit), creates the `runner` user with uid
# 10001 (the image's user, so the job container can write the mounted workspace), unpacks the
# runner release after checking its sha256, and installs a systemd service that registers an
# *ephemeral* runner (one job, then it unregisters and a fresh registration follows), labels
# self-hosted,linux,x64,gpu, in the given runner group. Jobs then run in one container each.
set -euo pipefail

usage() {
	echo "usage: $0 --url URL --group GROUP --runner-version V --runner-sha256 SHA --token-command CMD" >&2
	exit 2
}
die() {
	echo "setup-gpu-runner: error: $*" >&2
	exit 1
}
url='' group='' version='' sha='' token_cmd=''
while (($#)); do
	case $1 in
	--url) url=$2 ;;
	--group) group=$2 ;;
	--runner-version) version=$2 ;;
	--runner-sha256) sha=$2 ;;
	--token-command) token_cmd=$2 ;;
	*) usage ;;
	esac
	shift 2 || usage
done
[[ -n $url && -n $group && -n $version && -n $token_cmd ]] || usage
[[ $sha =~ ^[0-9a-f]{64}$ ]] || die "--runner-sha256 must be the release's 64-hex sha256 (from its release page)"
((EUID == 0)) || die "run as root (it creates a user and a systemd service)"

nvidia-smi -L >/dev/null 2>&1 || die "nvidia-smi fails: install or repair the NVIDIA driver first"
docker info >/dev/null 2>&1 || die "Docker does not answer: install Docker Engine first"
docker info --format '{{json .Runtimes}}' | grep -q nvidia ||
	die "Docker has no nvidia runtime: install the NVIDIA Container Toolkit (nvidia-ctk runtime configure)"

home=/opt/actions-runner
if ! id runner >/dev/null 2>&1; then
	useradd --uid 10001 --create-home --home-dir "$home" --shell /bin/bash runner
fi
[[ $(id -u runner) == 10001 ]] || die "user runner exists with uid $(id -u runner), need 10001 (the image's user)"
usermod -aG docker runner

# Downloaded into a folder of its own (`mktemp -d`, root's alone), never a fixed path in /tmp:
# another local user could make that path first (a link, a file of theirs swapped in between
# the sha256 check and the unpacking), and root would unpack what they put there.
tarball=actions-runner-linux-x64-$version.tar.gz
download=$(mktemp -d)
trap 'rm -rf "$download"' EXIT
curl -fsSL -o "$download/$tarball" "https://github.com/actions/runner/releases/download/v$version/$tarball"
echo "$sha  $download/$tarball" | sha256sum -c --quiet - || die "$tarball does not match --runner-sha256"
tar -xzf "$download/$tarball" -C "$home"
rm -rf "$download"
chown -R runner:runner "$home"

# One ephemeral registration per job: a fresh token each time, the runner exits after one job.
cat >"$home/run-ephemeral.sh" <<EOS
#!/usr/bin/env bash
set -euo pipefail
cd "$home"
# A fresh work folder per registration: a job must find nothing the one before it left (git
# hooks planted in a checkout, caches, tool folders). Refuse to register when it cannot be wiped.
rm -rf "$home/_work"
[[ ! -e "$home/_work" ]] || { echo "run-ephemeral: cannot remove $home/_work" >&2; exit 1; }
token=\$($token_cmd)
./config.sh --unattended --ephemeral --replace --disableupdate --url "$url" --token "\$token" \\
    --runnergroup "$group" --labels gpu --name "\$(hostname)-gpu" --work _work
exec ./run.sh
EOS
chmod 755 "$home/run-ephemeral.sh"
cat >/etc/systemd/system/lockstep-gpu-runner.service <<EOS
[Unit]
Description=lockstep ephemeral GPU runner
After=docker.service network-online.target
[Service]
User=runner
ExecStart=$home/run-ephemeral.sh
Restart=always
RestartSec=5
[Install]
WantedBy=multi-user.target
EOS
systemctl daemon-reload
systemctl enable --now lockstep-gpu-runner.service
echo "setup-gpu-runner: lockstep-gpu-runner.service started; check the runner group's settings (docs/gpu-runners.md)"
