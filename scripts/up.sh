#!/usr/bin/env bash
# Brings up a local agentbox: installs what is missing, builds, and runs the
# server in the foreground (it prints its URL, API key and an example).
# Environment: AGENTBOX_DATA_DIR (default /var/lib/agentbox),
# AGENTBOX_LISTEN (default 127.0.0.1:3000),
# AGENTBOX_TEMPLATE_DIR (default /var/cache/agentbox/templates; serve records
# it in the data dir, so `sudo bin/agentbox template build NAME` builds there).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PATH="/usr/local/go/bin:$PATH"
AGENTBOX_DEPS=server bash scripts/install-deps.sh
make build
exec bin/agentbox serve \
	--data-dir "${AGENTBOX_DATA_DIR:-/var/lib/agentbox}" \
	--listen "${AGENTBOX_LISTEN:-127.0.0.1:3000}" \
	--template-dir "${AGENTBOX_TEMPLATE_DIR:-/var/cache/agentbox/templates}" \
	--envd bin/envd
