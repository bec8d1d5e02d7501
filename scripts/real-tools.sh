#!/usr/bin/env bash
# Unpacks the real Kubewarden and Kubernetes tools (kwctl and policy-server 1.35, kube-apiserver
# and kube-controller-manager 1.36, verify-image-signatures 1.0.11; built from their release
# sources, see their README) into TOOLS_DIR, with etcd and openssl for the loopback control
# plane, and prints TOOLS_DIR. The tests and `make e2e-tests` use them from there.
#
# Where they come from: SHARED_TOOLS when set (only there), else ../shared/tools beside this
# checkout, and nowhere else (no path of one machine). Where neither is, tools already unpacked
# in TOOLS_DIR are used; else it says how to get them and exits 3: `make test` then runs without
# them (each test that needs one says it did not run), and CI (CI=true) fails.
# `SHARED_TOOLS=/none TOOLS_DIR=/tmp/none make test` is a machine without them.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dest=${TOOLS_DIR:-$HOME/.cache/image-swapper-tools}
shared=${SHARED_TOOLS-$root/../shared/tools}
if [[ ! -x $shared/unpack.sh ]]; then
  if [[ -x $dest/bin/kwctl && -x $dest/bin/policy-server ]]; then
    echo "$dest"
    exit 0
  fi
  cat >&2 <<EOF
real-tools: no tools folder ($shared: SHARED_TOOLS, else ../shared/tools beside the checkout)
and none unpacked in $dest (TOOLS_DIR): the tests that need kwctl,
policy-server or kube-apiserver will say they did not run. To run them, put in $dest/bin:
kwctl and policy-server (https://github.com/kubewarden/kubewarden-controller/releases; policy-server
is also in ghcr.io/kubewarden/policy-server), kube-apiserver and kube-controller-manager
(https://dl.k8s.io/release/v1.36.0/bin/linux/amd64/), verify-image-signatures.wasm
(kwctl pull registry://ghcr.io/kubewarden/policies/verify-image-signatures:v1.0.11), and etcd.
EOF
  exit 3
fi
# etcdctl (etcd-client) compacts the test etcd, to expire a watch (fill-mirror's watch_api_server).
"$root/scripts/ensure-packages.sh" etcd-server etcd-client openssl
"$shared/unpack.sh" "$dest" >/dev/null
cp "$shared/sigstore-trust-config.json" "$dest/"
echo "$dest"
