#!/usr/bin/env bash
# Installs kwctl, the release and checksum Kubewarden's own policy CI pins (kubewarden/policies
# .github/actions/install-dependencies), into ~/.kwctl, and puts it on the workflow's PATH.
set -euo pipefail
version=v1.35.0
checksum=2f518033989a897c2f502a2f4fa90b3ca666eee976a82d045abdea5022330341
asset=kwctl-linux-x86_64
dir=$HOME/.kwctl
mkdir -p "$dir"
curl -sSfL "https://github.com/kubewarden/kubewarden-controller/releases/download/$version/$asset.zip" -o "$dir/$asset.zip"
echo "$checksum  $dir/$asset.zip" | sha256sum -c -
unzip -o -q "$dir/$asset.zip" -d "$dir"
rm "$dir/$asset.zip"
mv "$dir/$asset" "$dir/kwctl"
chmod 755 "$dir/kwctl"
[[ -n ${GITHUB_PATH:-} ]] && echo "$dir" >>"$GITHUB_PATH"
"$dir/kwctl" --version
