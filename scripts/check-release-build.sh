#!/usr/bin/env bash
# The release build, on a fresh clone, with the commands Kubewarden's policy-build-rust action
# runs, word for word: `cargo build --target=wasm32-wasip1 --release --locked` at the root, then
# `target/wasm32-wasip1/release/*.wasm` copied to policy.wasm, so exactly one module must be
# there (the benchmark's floor policy is a workspace member that a root build leaves out). Then
# the e2e suite on that module: with kwctl (annotated) where it is installed, else with the
# project's stand-in. Without rustup's wasm32-wasip1 target, the same command line runs on
# Debian's offline kit (TOOLCHAIN.md), which only the environment below differs for.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
clone=$(mktemp -d)/image-swapper-policy
trap 'rm -rf "$(dirname "$clone")"' EXIT
git clone --quiet "$root" "$clone"
cd "$clone"
if ! { command -v rustup >/dev/null && rustup target list --installed 2>/dev/null | grep -qx wasm32-wasip1; }; then
  "$root/scripts/ensure-packages.sh" rustc-web rust-web-src wasi-libc
  host=$(rustc -vV | sed -n 's/^host: //p')
  export RUSTC_BOOTSTRAP=1 RUSTC=/usr/bin/rustc CARGO_UNSTABLE_BUILD_STD=std,panic_abort
  export RUSTFLAGS="-L native=/usr/lib/wasm32-wasi -C linker=$(rustc --print sysroot)/lib/rustlib/$host/bin/rust-lld"
  echo "release build: rustup has no wasm32-wasip1 target; Debian's kit, -Zbuild-std through CARGO_UNSTABLE_BUILD_STD"
fi
# policy-build-rust, verbatim:
cargo build --target=wasm32-wasip1 --release --locked
modules=(target/wasm32-wasip1/release/*.wasm)
if ((${#modules[@]} != 1)); then
  echo "release build: ${#modules[@]} modules in target/wasm32-wasip1/release: ${modules[*]}" >&2
  exit 1
fi
cp target/wasm32-wasip1/release/*.wasm policy.wasm
echo "release build: one module, ${modules[0]##*/}, $(stat -c %s policy.wasm) bytes"
# kwctl as `make e2e-tests` picks it: the real tools' (TOOLS_DIR), else one on PATH.
tools_dir=${TOOLS_DIR:-$HOME/.cache/image-swapper-tools}
kwctl=$tools_dir/bin/kwctl
[[ -x $kwctl ]] || kwctl=$(command -v kwctl || true)
if [[ -n $kwctl ]]; then
  echo "e2e-tests: with $kwctl ($("$kwctl" --version 2>&1 | head -n 1))"
  make annotated-policy.wasm KWCTL="$kwctl"
  trust=$tools_dir/sigstore-trust-config.json
  [[ -f $trust ]] || trust=
  SIGSTORE_TRUST_CONFIG=$trust KWCTL=$kwctl POLICY=annotated-policy.wasm bats e2e/
elif [[ ${CI:-} == true ]]; then
  echo "release build: no kwctl in CI: the real tools are missing (make tools)" >&2
  exit 1
else
  # The stand-in is native code: built in the tree this clone came from, not here.
  (cd "$root" && env -u RUSTC_BOOTSTRAP -u RUSTC -u CARGO_UNSTABLE_BUILD_STD -u RUSTFLAGS \
    cargo build --locked --quiet --example kwctl-standin)
  KWCTL="$root/target/debug/examples/kwctl-standin" POLICY=policy.wasm bats e2e/
fi
