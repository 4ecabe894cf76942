#!/usr/bin/env bash
# Installs code-server from npm into a project-local folder, offline-safe: npm's install
# scripts are skipped (the @vscode/ripgrep one downloads a binary from the internet and
# the package's own postinstall would run it), then the native modules are rebuilt
# against Node's headers, Debian's rg takes the place of the downloaded one, and the
# links the postinstall makes are made here.
#
#   tests/e2e/install-code-server.sh DEST VERSION
#
# Needs Node 20 (code-server 4.100 refuses others), g++, make, and libkrb5-dev (for the
# kerberos module); `make e2e` installs those first.
set -euo pipefail

dest=$1
version=$2
stamp="$dest/.installed-$version"
[ -f "$stamp" ] && exit 0

node_major=$(node -p 'process.versions.node.split(".")[0]')
if [ "$node_major" != 20 ]; then
  echo "code-server $version needs Node 20; this is Node $(node --version)" >&2
  exit 2
fi
rg=$(command -v rg) || { echo "ripgrep (rg) is not installed: apt-get install ripgrep" >&2; exit 2; }

rm -rf "$dest"
mkdir -p "$dest"
dest=$(cd "$dest" && pwd)
stamp="$dest/.installed-$version"
# Node's headers come with the nodejs package (/usr/include/node); without this node-gyp
# would download them.
nodedir=$(dirname "$(dirname "$(command -v node)")")
export npm_config_nodedir=$nodedir npm_config_yes=true npm_config_audit=false npm_config_fund=false

npm install --prefix "$dest" --ignore-scripts --no-save "code-server@$version"
app="$dest/node_modules/code-server"
(cd "$dest" && npm rebuild argon2)

cd "$app/lib/vscode"
npm install --omit=dev --ignore-scripts
# Every native module of VS Code's server except @vscode/ripgrep (a download) and the
# Windows-only ones.
npm rebuild kerberos @parcel/watcher node-pty @vscode/spdlog @vscode/deviceid native-watchdog
mkdir -p node_modules/@vscode/ripgrep/bin
ln -sfn "$rg" node_modules/@vscode/ripgrep/bin/rg
ln -sfn node_modules node_modules.asar
ln -sfn code-linux.sh bin/remote-cli/code-server
ln -sfn browser-linux.sh bin/helpers/browser.sh
(cd extensions && npm install --omit=dev --ignore-scripts)

"$dest/node_modules/.bin/code-server" --version >/dev/null
touch "$stamp"
