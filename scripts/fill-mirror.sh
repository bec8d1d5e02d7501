#!/usr/bin/env bash
# Fills the mirror from Kubewarden's reports: takes the `fail` results of the checking policy,
# finds the copies their messages give, removes duplicates, and runs them with skopeo. It ends
# with one summary line, and exits 1 when a copy failed.
#
# The reports are Kubewarden's audit scanner's (kubewarden-controller internal/audit-scanner
# report/openreports.go and policyreports.go): `openreports.io` Reports (the Helm chart's default)
# and `wgpolicyk8s.io` PolicyReports, each with `.results[]` of {policy: "clusterwide-<name>" or
# "namespaced-<namespace>-<name>", result: pass | fail | error, message, ...}. A copy is the form
# the policy writes in a message, and nothing else is read from it:
#   skopeo copy --all --preserve-digests docker://SOURCE docker://DESTINATION
# with both references in the reference grammar's characters ([A-Za-z0-9._:@/-]).
#
# A copy whose destination already exists is skipped, never made: the policy names a digest's
# own tag (sha256-<hex>) or a tag the mirror said it lacks, so an existing destination is either
# that very copy, made since the scan, or a tag someone filled since; copying over it could move
# a tag to other content.
#
# Usage:
#   fill-mirror.sh [--policy NAME] [--reports FILE]... [--dry-run] [--insecure]
#       Reads the reports (FILE, `kubectl get -o json` output; without --reports, from the
#       cluster with kubectl), then copies. Needs jq, skopeo, and kubectl without --reports.
#   fill-mirror.sh --list [--policy NAME] [--reports FILE]...
#       Prints the copies, one "SOURCE DESTINATION" a line (needs jq, and kubectl without --reports).
#   fill-mirror.sh --copies FILE [--dry-run] [--insecure]
#       Copies what --list printed (needs skopeo only): a job can read the reports in one
#       container and copy in another.
# --policy defaults to clusterwide-image-swapper-check (a ClusterAdmissionPolicy named
# image-swapper-check). --insecure lets skopeo use plain HTTP and unverified TLS. skopeo reads
# the mirror's push credentials from REGISTRY_AUTH_FILE (a docker config.json).
set -euo pipefail

policy=clusterwide-image-swapper-check
reports=()
copies_file=
mode=copy
dry_run=false
tls=()

while (($#)); do
  case $1 in
    --policy) policy=${2:?--policy needs a name}; shift 2 ;;
    --reports) reports+=("${2:?--reports needs a file}"); shift 2 ;;
    --copies) copies_file=${2:?--copies needs a file}; shift 2 ;;
    --list) mode=list; shift ;;
    --dry-run) dry_run=true; shift ;;
    --insecure) tls=(--tls-verify=false); shift ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "fill-mirror: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done

# The reports as JSON documents, one after another: from files, or from the cluster (each kind
# that is installed; a kind the cluster lacks is skipped with a note).
read_reports() {
  if ((${#reports[@]})); then
    cat "${reports[@]}"
    return
  fi
  local kind found=false
  for kind in reports.openreports.io policyreports.wgpolicyk8s.io; do
    if kubectl get "$kind" --all-namespaces -o json 2>/dev/null; then
      found=true
    else
      echo "fill-mirror: no $kind in this cluster, skipped" >&2
    fi
  done
  $found || { echo "fill-mirror: could not read any report kind with kubectl" >&2; exit 2; }
}

# "SOURCE DESTINATION" for every copy in this policy's fail results, each once, in order.
list_copies() {
  local messages
  messages=$(read_reports |
    jq -r --arg policy "$policy" '
      (if type == "object" and has("items") then .items[] else . end)
      | .results[]?
      | select(.policy == $policy and .result == "fail")
      | .message // empty')
  { grep -oE 'skopeo copy --all --preserve-digests docker://[A-Za-z0-9._:@/-]+ docker://[A-Za-z0-9._:@/-]+' <<<"$messages" || true; } |
    sed -E 's|^skopeo copy --all --preserve-digests docker://([^ ]+) docker://([^ ]+)$|\1 \2|' |
    awk '!seen[$0]++'
}

if [[ $mode == list ]]; then
  list_copies
  exit 0
fi

if [[ -n $copies_file ]]; then
  copies=$(awk '!seen[$0]++' "$copies_file")
else
  copies=$(list_copies)
fi

copied=0 failed=0 skipped=0
while read -r source destination; do
  [[ -n ${source:-} && -n ${destination:-} ]] || continue
  if $dry_run; then
    echo "would copy docker://$source to docker://$destination"
    continue
  fi
  if skopeo inspect --raw "${tls[@]}" "docker://$destination" >/dev/null 2>&1; then
    echo "skipped docker://$destination: it exists already"
    skipped=$((skipped + 1))
    continue
  fi
  if output=$(skopeo copy --all --preserve-digests \
      ${tls:+--src-tls-verify=false --dest-tls-verify=false} \
      "docker://$source" "docker://$destination" 2>&1); then
    echo "copied docker://$source to docker://$destination"
    copied=$((copied + 1))
  else
    echo "failed docker://$source to docker://$destination: $(tail -n 1 <<<"$output")"
    failed=$((failed + 1))
  fi
done <<<"$copies"

if $dry_run; then
  echo "fill-mirror: dry run, $(grep -c . <<<"$copies" || true) copies, none made"
  exit 0
fi
echo "fill-mirror: $copied copied, $failed failed, $skipped skipped"
((failed == 0))
