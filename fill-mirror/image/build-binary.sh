#!/usr/bin/env bash
# The fill controller's binary for one image platform, as fill-mirror/Dockerfile's build stage
# runs it (and scripts/check-image-build.sh runs it on this machine for linux/amd64, so what
# the image carries is what CI checked): `cargo build --locked --profile image -p fill-mirror`
# (the workspace's `image` profile: Cargo.toml says why) for the
# Rust target of docker's TARGETARCH, cross-compiled from the build machine's platform with
# Debian's cross gcc (ring's C and assembly, and the link). Usage: build-binary.sh ARCH OUT.
set -euo pipefail
arch=${1:?usage: build-binary.sh amd64|arm64 OUT}
out=${2:?usage: build-binary.sh amd64|arm64 OUT}
case $arch in
  amd64) target=x86_64-unknown-linux-gnu gcc=x86_64-linux-gnu-gcc ;;
  arm64) target=aarch64-unknown-linux-gnu gcc=aarch64-linux-gnu-gcc ;;
  *) echo "build-binary.sh: no Rust target for the platform's architecture $arch (amd64, arm64)" >&2; exit 1 ;;
esac
host=$(rustc -vV | sed -n 's/^host: //p')
if [[ $target != "$host" ]]; then
  upper=$(tr 'a-z-' 'A-Z_' <<<"$target")
  export "CARGO_TARGET_${upper}_LINKER=$gcc" "CC_${target//-/_}=$gcc"
fi
cargo build --locked --profile image -p fill-mirror --target "$target"
install -D -m 0755 "${CARGO_TARGET_DIR:-target}/$target/image/fill-mirror" "$out"
echo "build-binary.sh: $out for linux/$arch ($target)"
