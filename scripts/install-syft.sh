#!/usr/bin/env bash
# Installs syft, the SBOM generator, at the release and checksum Kubewarden's own policy CI
# pins (kubewarden/policies .github/actions/install-dependencies), into ~/.syft.
set -euo pipefail
version=1.28.0
checksum=3edee7fe1ceb1f78360e547f57048930d57f00c7ec3d0b8bdfb902805f048468
dir=$HOME/.syft
mkdir -p "$dir"
curl -sSfL "https://github.com/anchore/syft/releases/download/v$version/syft_${version}_linux_amd64.tar.gz" -o "$dir/syft.tar.gz"
echo "$checksum  $dir/syft.tar.gz" | sha256sum -c -
tar xzf "$dir/syft.tar.gz" -C "$dir" syft
rm "$dir/syft.tar.gz"
