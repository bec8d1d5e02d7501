#!/usr/bin/env bash
# Installs the Debian packages named on the command line when any is missing. Used by the
# Makefile and by .ci/run, so that a fresh machine needs no step done by hand.
# With --upgrade first, it installs the newest version of each from a fresh package list, even
# when one is installed (an older kit installed from a stale list, say).
set -euo pipefail
upgrade=false
if [[ ${1:-} == --upgrade ]]; then upgrade=true; shift; fi
missing=()
for package in "$@"; do
  if $upgrade; then missing+=("$package"); continue; fi
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
done
((${#missing[@]} == 0)) && exit 0
echo "installing Debian packages: ${missing[*]}" >&2
if [[ $(id -u) -ne 0 ]]; then
  if command -v sudo >/dev/null; then sudo=sudo; else
    echo "error: not root and no sudo; run: apt-get install -y ${missing[*]}" >&2
    exit 1
  fi
fi
export DEBIAN_FRONTEND=noninteractive
# A stale package list can miss the security suite's packages: update first.
${sudo:-} apt-get update -qq >&2
only_upgrade=()
$upgrade && only_upgrade=(--only-upgrade)
${sudo:-} apt-get install -y -qq --no-install-recommends "${only_upgrade[@]}" "${missing[@]}" >&2
