#!/usr/bin/env bash
# What can be checked here of the fill controller's image (fill-mirror/Dockerfile) without
# docker: its build stage's own command (fill-mirror/image/build-binary.sh, the file the
# Dockerfile runs) for linux/amd64 on this machine, then the binary against the final stage:
# an x86-64 ELF executable, linked only against libraries Debian's base image has, needing no
# glibc newer than that image's, and `fill-mirror --version` saying the crate's version. Also
# that the Dockerfile still builds with the workspace's rust-version and runs that script.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
dockerfile=fill-mirror/Dockerfile
fail() { echo "check-image-build: $*" >&2; exit 1; }
# The final stage's base and its glibc (Debian 13 "trixie" ships glibc 2.41).
final_base='docker.io/library/debian:trixie-slim'
final_glibc=2.41
grep -qx "FROM $final_base" "$dockerfile" \
  || fail "$dockerfile: the final stage is not FROM $final_base (update final_glibc here with it)"
rust_version=$(sed -n 's/^rust-version = "\(.*\)"/\1/p' fill-mirror/Cargo.toml)
grep -q "^FROM --platform=\$BUILDPLATFORM docker.io/library/rust:$rust_version-bookworm AS build\$" "$dockerfile" \
  || fail "$dockerfile: the build stage is not rust:$rust_version-bookworm (fill-mirror/Cargo.toml's rust-version)"
grep -q 'fill-mirror/image/build-binary.sh "\$TARGETARCH" /out/fill-mirror' "$dockerfile" \
  || fail "$dockerfile: the build stage does not run fill-mirror/image/build-binary.sh"

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
started=$SECONDS
fill-mirror/image/build-binary.sh amd64 "$out/fill-mirror"
binary=$out/fill-mirror
echo "check-image-build: built in $((SECONDS - started)) s, $(stat -c %s "$binary") bytes"

header=$(readelf -h "$binary")
grep -Eq 'Class: +ELF64' <<<"$header" || fail "not a 64-bit ELF: $(grep Class <<<"$header")"
grep -Eq 'Machine: +Advanced Micro Devices X86-64' <<<"$header" \
  || fail "not for x86-64: $(grep Machine <<<"$header")"
grep -Eq 'Type: +(EXEC|DYN)' <<<"$header" || fail "not an executable: $(grep Type: <<<"$header")"

# Every shared library it needs is glibc's or libgcc's, which the slim image carries.
needed=$(readelf -d "$binary" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
for library in $needed; do
  case $library in
    libc.so.6 | libm.so.6 | libgcc_s.so.1 | ld-linux-x86-64.so.2 | libpthread.so.0 | libdl.so.2 | librt.so.1) ;;
    *) fail "it needs $library, which $final_base does not carry" ;;
  esac
done

newest=$(readelf -V "$binary" | grep -Eo 'GLIBC_[0-9]+(\.[0-9]+)+' | sed 's/GLIBC_//' | sort -uV | tail -n 1)
[[ -n $newest ]] || fail "no GLIBC symbol version found (readelf -V)"
if [[ $(printf '%s\n%s\n' "$newest" "$final_glibc" | sort -V | tail -n 1) != "$final_glibc" ]]; then
  fail "it needs GLIBC_$newest, newer than $final_base's $final_glibc"
fi

version=$(sed -n 's/^version = "\(.*\)"/\1/p' fill-mirror/Cargo.toml | head -n 1)
said=$("$binary" --version)
[[ $said == "fill-mirror $version" ]] || fail "--version says \"$said\", not \"fill-mirror $version\""
echo "check-image-build: x86-64 ELF, needs $(tr '\n' ' ' <<<"$needed")and GLIBC_$newest (<= $final_glibc); \"$said\""
