#!/usr/bin/env bash
# Builds policy.wasm for wasm32-wasip1. It takes rustup's wasm32-wasip1 target when it is
# installed (the usual set-up); otherwise it falls back to Debian's offline kit (rustc-web,
# rust-web-src, wasi-libc) and builds the standard library with -Zbuild-std, installing the kit
# when it is missing. It says which way it took.
#
# Usage: scripts/build-wasm.sh [PACKAGE OUTPUT]   (default: image-swapper-policy policy.wasm)
set -euo pipefail
cd "$(dirname "$0")/.."
package=${1:-image-swapper-policy}
output=${2:-policy.wasm}
target=wasm32-wasip1
if command -v rustup >/dev/null && rustup target list --installed 2>/dev/null | grep -qx "$target"; then
  echo "$output: building with rustup's installed $target target" >&2
  target_dir=target
  cargo build --locked --release --lib --package "$package" --target "$target"
else
  echo "$output: rustup has no $target target; building with Debian's offline kit (rustc-web, rust-web-src, wasi-libc) and -Zbuild-std" >&2
  scripts/ensure-packages.sh rustc-web rust-web-src wasi-libc
  # A kit installed earlier from a stale package list can be older than the crate's
  # rust-version (cargo would stop with "requires rustc 1.95"): upgrade it, or say what to run.
  wanted=$(sed -n 's/^rust-version *= *"\([0-9.]*\)"/\1/p' Cargo.toml)
  version_of_kit() { /usr/bin/rustc --version | awk '{print $2}'; }
  older() { [[ $(printf '%s\n%s\n' "$1" "$2" | sort -V | head -n 1) == "$1" && $1 != "$2" ]]; }
  if [[ -n $wanted ]] && older "$(version_of_kit)" "$wanted"; then
    echo "$output: Debian's rustc-web is $(version_of_kit), older than rust-version $wanted; upgrading it" >&2
    scripts/ensure-packages.sh --upgrade rustc-web rust-web-src
    if older "$(version_of_kit)" "$wanted"; then
      echo "error: Debian's rustc-web is still $(version_of_kit) and this crate needs $wanted; run: rustup target add $target (or apt-get update && apt-get install --only-upgrade rustc-web rust-web-src)" >&2
      exit 1
    fi
  fi
  host=$(rustc -vV | sed -n 's/^host: //p')
  lld="$(rustc --print sysroot)/lib/rustlib/$host/bin/rust-lld"
  [[ -x $lld ]] || { echo "error: no rust-lld at $lld" >&2; exit 1; }
  # Its own target directory: another compiler would invalidate the native build's cache.
  target_dir=target/debian-kit
  RUSTC_BOOTSTRAP=1 RUSTC=/usr/bin/rustc \
  RUSTFLAGS="-L native=/usr/lib/wasm32-wasi -C linker=$lld" \
    cargo build --locked --release --lib --package "$package" --target "$target" --target-dir "$target_dir" \
      -Zbuild-std=std,panic_abort
fi
cp "$target_dir/$target/release/${package//-/_}.wasm" "$output"
echo "$output: $(stat -c %s "$output") bytes" >&2
