#!/usr/bin/env bash
# Installs what agentbox and its tests need on Debian 12, as root. Idempotent:
# a machine that has everything is left alone in a few seconds.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
log() { printf 'install-deps: %s\n' "$*" >&2; }

if [[ $(id -u) -ne 0 ]]; then
	log "run as root (apt-get, runc and network namespaces need it)"
	exit 1
fi

# Debian packages: the OCI runtime, the template builder, the firewall and
# netlink tools the server drives, and the toolchain for the tests.
pkgs=(runc mmdebstrap nftables iproute2 jq ca-certificates curl make gcc git)
# Node.js 20 or newer for the official e2b SDK (it refuses older engines).
# Debian 12's own nodejs is 18; use the node already on the machine if new enough.
node_major=0
if command -v node >/dev/null; then
	node_major=$(node -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0)
fi
if ((node_major < 20)); then
	pkgs+=(nodejs npm)
fi
command -v npm >/dev/null || pkgs+=(npm)

missing=()
for p in "${pkgs[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if ((${#missing[@]})); then
	log "installing ${missing[*]}"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
	log "Debian packages present"
fi

if command -v node >/dev/null; then
	node_major=$(node -p 'process.versions.node.split(".")[0]')
	if ((node_major < 20)); then
		log "node $(node --version) is too old for the e2b SDK (needs >= 20.18); install Node.js 20+"
		exit 1
	fi
fi

# Go is not a Debian package here: it is expected at /usr/local/go.
if ! command -v go >/dev/null && [[ ! -x /usr/local/go/bin/go ]]; then
	log "Go is missing: install Go >= 1.26 at /usr/local/go (https://go.dev/dl/)"
	exit 1
fi

# The JS end-to-end suite's pinned SDKs; skipped when the lock file has not
# changed since the last install.
js="$root/e2e/js"
if [[ -f $js/package-lock.json ]]; then
	if [[ ! -f $js/node_modules/.package-lock.json || $js/package-lock.json -nt $js/node_modules/.package-lock.json ]]; then
		log "npm ci in e2e/js"
		(cd "$js" && npm ci --no-audit --no-fund --loglevel=error)
	else
		log "e2e/js node_modules up to date"
	fi
fi
log "done"
