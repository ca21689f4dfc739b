#!/usr/bin/env bash
# The browser VS Code the end-to-end editor tests drive (tests/editors/test_vscode_e2e.py):
# code-server from npm into .e2e/code-server, Chromium and its WebDriver from Debian,
# selenium from PyPI (the test extras). ~2-3 min. Run: scripts/install-code-server.sh
set -euo pipefail
cd "$(dirname "$0")/.."
# 4.100.3 is the newest code-server that runs on Debian 12's Node 20 (later ones need Node 24)
CODE_SERVER_VERSION=4.100.3
PREFIX=.e2e/code-server

need=()
command -v chromium >/dev/null || need+=(chromium)
command -v chromedriver >/dev/null || need+=(chromium-driver)
command -v rg >/dev/null || need+=(ripgrep)
# code-server's own install builds VS Code's native modules: kerberos needs gssapi headers
dpkg -s libkrb5-dev >/dev/null 2>&1 || need+=(libkrb5-dev)
command -v make >/dev/null && command -v g++ >/dev/null || need+=(build-essential)
command -v npm >/dev/null || need+=(nodejs npm)
if (( ${#need[@]} )); then
    if (( EUID != 0 )); then
        echo "install-code-server: needs root to install ${need[*]} (Debian: apt-get install ${need[*]})" >&2
        exit 1
    fi
    echo "install-code-server: apt-get install ${need[*]}"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi

if [[ -x "$PREFIX/node_modules/.bin/code-server" ]]; then
    echo "install-code-server: $PREFIX already holds code-server $("$PREFIX/node_modules/.bin/code-server" --version | head -1)"
    exit 0
fi
# @vscode/ripgrep's postinstall downloads rg from api.github.com, which a machine limited
# to the package registries cannot reach; it takes a tarball already in its download
# cache instead, so seed that cache with Debian's rg.
RG_CACHE="$(node -e 'console.log(require("os").tmpdir())')/vscode-ripgrep-cache-1.15.11"
mkdir -p "$RG_CACHE"
tmp=$(mktemp -d) && cp "$(command -v rg)" "$tmp/rg"
tar czf "$RG_CACHE/ripgrep-v13.0.0-10-x86_64-unknown-linux-musl.tar.gz" -C "$tmp" rg && rm -rf "$tmp"
# code-server's postinstall refuses to run as root without unsafe-perm, and runs
# `npx node-gyp`, which npm 11 cancels unless told yes
echo "install-code-server: npm install code-server@$CODE_SERVER_VERSION (~1 min)"
mkdir -p "$PREFIX"
npm_config_unsafe_perm=true npm_config_yes=true \
    npm install --prefix "$PREFIX" --no-audit --no-fund --loglevel=error "code-server@$CODE_SERVER_VERSION"
"$PREFIX/node_modules/.bin/code-server" --version | head -1
