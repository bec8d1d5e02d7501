# image-swapper-policy: Kubewarden's usual targets, plus `deps`, `run` and `bench`.
SHELL := bash
CARGO ?= cargo
# The real kwctl, policy-server and kube-apiserver, where scripts/real-tools.sh unpacks them
# (`make tools`); the tests that need them read TOOLS_DIR too.
TOOLS_DIR ?= $(HOME)/.cache/image-swapper-tools
export TOOLS_DIR
# kwctl: KWCTL when set, else the real tools' kwctl 1.35, else one on PATH; empty when none is.
KWCTL ?=
kwctl = $(or $(KWCTL),$(shell [[ -x $(TOOLS_DIR)/bin/kwctl ]] && echo $(TOOLS_DIR)/bin/kwctl || command -v kwctl))
SOURCES := $(shell find src -name '*.rs') Cargo.toml Cargo.lock
# Debian packages the tests need: the CNCF distribution registry, bats for e2e/, jq, and skopeo
# (the rig's tag-filled cache copies with it; so does the fill controller), prometheus for
# promtool, which tests the alerts (tests/docs.rs), and a real node's runtime beside the real
# tools' kubelet (tests/real_node.rs): containerd, runc, the CNI plugins and iproute2; and faketime,
# whose libfaketime runs fill-mirror a month on in tests/retention_chain.rs. From PyPI:
# moto's server and the AWS CLI, for the ECR tests (scripts/ensure-python-tools.sh, `make test-deps`).
TEST_PACKAGES := docker-registry bats jq skopeo prometheus containerd runc containernetworking-plugins iproute2 faketime

.PHONY: deps tools test-deps test run e2e-tests fmt lint bench clean push check-kwctl fuzz

# Picks rustup's wasm32-wasip1 target when installed, else Debian's offline kit; says which.
policy.wasm: $(SOURCES)
	scripts/build-wasm.sh

annotated-policy.wasm: policy.wasm metadata.yml README.md | check-kwctl
	$(kwctl) annotate -m metadata.yml -u README.md -o $@ policy.wasm

deps:
	scripts/ensure-packages.sh $(TEST_PACKAGES)

# The real tools, unpacked from ../shared/tools (scripts/real-tools.sh). Where there are none,
# it says how to get them and the tests that need them say they did not run; in CI (CI=true)
# that fails.
tools:
	@scripts/real-tools.sh >/dev/null || { status=$$?; [[ $$status == 3 && "$$CI" != true ]] || exit $$status; }

# What `make test` needs beside them: moto's server and the AWS CLI, for the ECR tests.
test-deps: deps
	scripts/ensure-python-tools.sh

# Unit tests, then the built module in a wasm host against real registries on loopback. The
# tests whose registries are far away (FAR_TESTS) run under the rig's host model of
# policy-server 1.35 (the default), 1.31 and 1.38, the three runs at once: their time is the
# rig's latency, not CPU (prune_wave waits about 110 s on 23 s of CPU), so together they take
# the longest one's time. Each run's log is printed whole once all have ended, under the command
# that made it (1.35's as plain `cargo test`, the default model), and any failing fails the
# target. tests/distance.rs runs every model itself. The examples are built for tests/docs.rs,
# which runs `make run`'s binary. Before them, the near tests run in two lanes at once, for the
# same reason (most of their time is kube-apiserver, the node and the relays' waits): most of
# them in one, fill-mirror's then NEAR_B_NAMES in the other; each log printed whole after both,
# under its command. After them, QUIET_NAMES alone.
FAR_NAMES := verify_source audit prune_wave
FAR_TESTS := $(addprefix --test ,$(FAR_NAMES))
NEAR_TESTS := $(addprefix --test ,$(filter-out $(FAR_NAMES),$(basename $(notdir $(wildcard tests/*.rs)))))
FAR_MODELS := 1.35 1.31 1.38
# The second lane's near tests, after fill-mirror's: long waits on kube-apiserver and
# policy-server, chosen so that the two lanes take about the same time.
NEAR_B_NAMES := deploy_apply ahead_of_pods
NEAR_B_TESTS := $(addprefix --test ,$(NEAR_B_NAMES))
# The tests that hold the policy to its time budget against the host (the 800 ms budget at 50 ms,
# policy-server's own timeout, the host's concurrency measured against the model's) run last,
# alone: under the lanes' load they measure the machine, not the policy.
QUIET_NAMES := model_vs_host signatures
QUIET_TESTS := $(addprefix --test ,$(QUIET_NAMES))
NEAR_A_TESTS := $(addprefix --test ,$(filter-out $(FAR_NAMES) $(NEAR_B_NAMES) $(QUIET_NAMES),$(basename $(notdir $(wildcard tests/*.rs)))))
test: test-deps tools policy.wasm
	$(CARGO) build --locked --examples
	$(CARGO) test --locked --no-run --lib $(NEAR_TESTS)
	$(CARGO) test --locked --no-run -p fill-mirror
	@failed=0; \
	$(CARGO) test --locked --no-fail-fast --lib $(NEAR_A_TESTS) >target/near-tests.log 2>&1 & \
	( $(CARGO) test --locked --no-fail-fast -p fill-mirror >target/fill-mirror-tests.log 2>&1; status=$$?; \
	  $(CARGO) test --locked --no-fail-fast $(NEAR_B_TESTS) >target/near-b-tests.log 2>&1 || status=1; \
	  exit $$status ) & \
	wait -n || failed=1; wait -n || failed=1; \
	echo "$(CARGO) test --locked --no-fail-fast --lib $(NEAR_A_TESTS)"; cat target/near-tests.log; \
	echo "$(CARGO) test --locked --no-fail-fast -p fill-mirror"; cat target/fill-mirror-tests.log; \
	echo "$(CARGO) test --locked --no-fail-fast $(NEAR_B_TESTS)"; cat target/near-b-tests.log; \
	exit $$failed
	@$(CARGO) test --locked --no-run $(FAR_TESTS) 2>/dev/null
	@failed=0; \
	for model in $(FAR_MODELS); do \
	  RIG_POLICY_SERVER=$$model $(CARGO) test --locked $(FAR_TESTS) >target/far-tests-$$model.log 2>&1 & \
	done; \
	for model in $(FAR_MODELS); do wait -n || failed=1; done; \
	for model in $(FAR_MODELS); do \
	  if [[ $$model == 1.35 ]]; then echo "$(CARGO) test --locked $(FAR_TESTS)"; \
	  else echo "RIG_POLICY_SERVER=$$model $(CARGO) test --locked $(FAR_TESTS)"; fi; \
	  cat target/far-tests-$$model.log; \
	done; \
	exit $$failed
	$(CARGO) test --locked --no-fail-fast $(QUIET_TESTS)

# The policy on examples/pod.json with examples/settings.yml; ARGS=--live asks a real registry.
run: policy.wasm $(if $(findstring --live,$(ARGS)),deps)
	$(CARGO) run --locked --quiet --example run -- $(ARGS)

# bats over e2e/ with real kwctl (the real tools' 1.35, else one on PATH) against
# annotated-policy.wasm; where there is none, with the project's stand-in
# (examples/kwctl-standin.rs) against policy.wasm, and in CI (CI=true) that fails. Says which.
KWCTL_STANDIN := target/debug/examples/kwctl-standin
e2e-tests: deps tools policy.wasm
	@if [[ -n "$(kwctl)" ]]; then \
	  echo "e2e-tests: with $(kwctl) ($$($(kwctl) --version 2>&1 | head -n 1))"; \
	  trust=$(TOOLS_DIR)/sigstore-trust-config.json; [[ -f $$trust ]] || trust=; \
	  $(MAKE) --no-print-directory annotated-policy.wasm KWCTL=$(kwctl) && \
	    SIGSTORE_TRUST_CONFIG=$$trust KWCTL=$(kwctl) POLICY=annotated-policy.wasm bats e2e/; \
	elif [[ "$$CI" == true ]]; then \
	  echo "e2e-tests: no kwctl in CI: the real tools are missing (make tools)" >&2; exit 1; \
	else \
	  echo "e2e-tests: kwctl is not installed; with the stand-in $(KWCTL_STANDIN) (docs/development.md: End-to-end tests)"; \
	  $(CARGO) build --locked --quiet --example kwctl-standin && KWCTL=$(KWCTL_STANDIN) POLICY=policy.wasm bats e2e/; \
	fi

fmt:
	$(CARGO) fmt --all -- --check

lint:
	$(CARGO) clippy --locked --all-targets -- -D warnings
	$(CARGO) clippy --locked -p fill-mirror --all-targets -- -D warnings

# The floor the benchmark compares with: a policy that only parses the request and accepts it.
target/floor-policy.wasm: bench/floor-policy/src/lib.rs bench/floor-policy/Cargo.toml Cargo.lock
	scripts/build-wasm.sh floor-policy $@

# fill-mirror's figures (fill-mirror/benches/fill.rs: the real kube-apiserver, skopeo, registries
# on loopback) run on the test build: their time is skopeo's, the API server's and the
# registries', not the binary's own work, so they need no release build of kube and tokio.
# The month-of-churn figures (fill-mirror/benches/churn.rs: the prune's own decision over 90
# simulated days) follow them. BENCH_ONLY=fill-mirror: those figures alone.
ifeq ($(BENCH_ONLY),fill-mirror)
bench: deps tools
	$(CARGO) test --locked -p fill-mirror --bench fill
	$(CARGO) test --locked -p fill-mirror --bench churn
else ifeq ($(BENCH_QUICK),1)
# BENCH_QUICK=1: every table of the admission benchmark, 3 runs a row, built as the tests are
# (the test profile, no second, LTO build of wasmtime): CI's proof that the benchmark runs to
# its end. Its figures are not the release build's; the docs quote `make bench`.
bench: deps tools policy.wasm target/floor-policy.wasm
	BENCH_QUICK=1 $(CARGO) test --locked --bench admission
	BENCH_QUICK=1 $(CARGO) test --locked -p fill-mirror --bench fill
	$(CARGO) test --locked -p fill-mirror --bench churn
else
bench: deps tools policy.wasm target/floor-policy.wasm
	$(CARGO) bench --locked --bench admission
	$(CARGO) test --locked -p fill-mirror --bench fill
	$(CARGO) test --locked -p fill-mirror --bench churn
endif

# make push REGISTRY=registry://ghcr.io/ORG/policies/image-swapper:v0.1.0
push: annotated-policy.wasm
	@[[ -n "$(REGISTRY)" ]] || { echo "set REGISTRY=registry://HOST/PATH:TAG" >&2; exit 1; }
	$(kwctl) push annotated-policy.wasm $(REGISTRY)

# A short run of each fuzz target (CI); FUZZ_SECONDS=600 for a longer one. Installs cargo-fuzz
# when missing. No sanitizer: the targets are safe Rust, and stable compilers have none.
FUZZ_SECONDS ?= 30
FUZZ_TARGETS := reference settings validate
fuzz:
	@command -v cargo-fuzz >/dev/null || $(CARGO) install cargo-fuzz --locked
	@cd fuzz && for target in $(FUZZ_TARGETS); do \
	  echo "fuzz: $$target for $(FUZZ_SECONDS) s (log: fuzz/$$target.log)"; \
	  RUSTC_BOOTSTRAP=1 $(CARGO) fuzz run --sanitizer none $$target -- \
	    -max_total_time=$(FUZZ_SECONDS) -rss_limit_mb=2048 > $$target.log 2>&1 \
	    || { tail -n 60 $$target.log; exit 1; }; \
	  grep -E '^(#[0-9]+ +DONE|Done )' $$target.log \
	    || { echo "fuzz: $$target did not run to the end (fuzz/$$target.log)"; exit 1; }; \
	done

check-kwctl:
	@[[ -n "$(kwctl)" ]] || { \
	  echo "kwctl is not installed: this target needs it (https://github.com/kubewarden/kwctl/releases)." >&2; \
	  echo "Without kwctl, 'make e2e-tests' runs the suite with the project's stand-in." >&2; \
	  exit 1; }

clean:
	$(CARGO) clean
	rm -f policy.wasm annotated-policy.wasm
