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
# It also reads the swapping policy's record on Pods it kept because the mirror lacked an image
# (label image-swapper.kubewarden.io/unmirrored, annotation
# image-swapper.kubewarden.io/unmirrored-images: per container, source, mirror and copy), so that
# a new image is copied within this job's period, not the audit scanner's. Anyone who can write
# a Pod's annotations could write such a record, so a Pod's copy is made only when it is the
# policy's own: its source is what the container runs, and its destination is where the
# swapping policy's settings route that source (the longest matching `source`, its first
# target; else `defaultMirror`). Any other is refused with a note, and never run.
#
# Usage:
#   fill-mirror.sh [--policy NAME] [--reports FILE]... [--pods FILE]... [--settings FILE]
#                  [--swap-policy NAME] [--ecr] [--dry-run] [--insecure] [--signatures]
#       Reads the reports and the Pods' records (from FILEs, `kubectl get ... -o json` output;
#       without --reports or --pods, both from the cluster with kubectl), then copies. Needs jq,
#       skopeo, and kubectl without files.
#   fill-mirror.sh --list [...]
#       Prints the copies, one "SOURCE DESTINATION" a line (needs jq, and kubectl without files).
#   fill-mirror.sh --copies FILE [--ecr] [--dry-run] [--insecure] [--signatures]
#       Copies what --list printed (needs skopeo only, and the AWS CLI with --ecr): a job can
#       read the reports in one container and copy in another.
# --policy defaults to clusterwide-image-swapper-check (a ClusterAdmissionPolicy named
# image-swapper-check). The swapping policy's settings route the Pods' copies: --settings FILE
# (its settings, or the policy object, as JSON), else from the cluster, the ClusterAdmissionPolicy
# --swap-policy (default image-swapper). --insecure lets skopeo use plain HTTP and unverified
# TLS. skopeo reads the mirror's push credentials from REGISTRY_AUTH_FILE (a docker
# config.json).
# --ecr: the mirror is Amazon ECR, which refuses a push to a repository that does not exist.
# Each destination repository is created first when missing (`aws ecr create-repository`, with
# the extra arguments in ECR_CREATE_REPOSITORY_ARGS, e.g. "--image-tag-mutability IMMUTABLE
# --encryption-configuration encryptionType=KMS"), and skopeo is logged in to each destination
# registry with `aws ecr get-login-password` at every run, from the job's own AWS identity (IRSA
# or EKS Pod Identity): no push Secret to renew. The region is the registry host's
# (<account>.dkr.ecr.<region>.amazonaws.com), else AWS_REGION.
#   fill-mirror.sh --ecr-prepare --copies FILE
#       The ECR part alone, for a container with the AWS CLI and no skopeo (the public AWS CLI
#       image): creates the missing repositories of the copies in FILE and writes the push login
#       to REGISTRY_AUTH_FILE, for a later `--copies FILE` run in the skopeo image.
# --signatures: with the swapping policy's `signatures`, also copy each image's cosign
# signature: once the image is in the mirror (copied, or there already), the tag
# sha256-<hex>.sig of its digest (the digest of the manifest the mirror now serves) is copied
# from the source repository to the mirror repository, when the source has it and the mirror
# does not. The policy swaps only to copies that verify, so without it a signed image is never
# swapped until something else copies its signature. The policy's own signature copies (the
# check role's findings, a record's signatureCopy) are made with or without it.
set -euo pipefail

policy=clusterwide-image-swapper-check
swap_policy=image-swapper
settings_file=
ecr=false
pods=()
reports=()
copies_file=
mode=copy
dry_run=false
signatures=false
tls=()

while (($#)); do
  case $1 in
    --policy) policy=${2:?--policy needs a name}; shift 2 ;;
    --reports) reports+=("${2:?--reports needs a file}"); shift 2 ;;
    --pods) pods+=("${2:?--pods needs a file}"); shift 2 ;;
    --settings) settings_file=${2:?--settings needs a file}; shift 2 ;;
    --swap-policy) swap_policy=${2:?--swap-policy needs a name}; shift 2 ;;
    --ecr) ecr=true; shift ;;
    --ecr-prepare) ecr=true; mode=ecr-prepare; shift ;;
    --copies) copies_file=${2:?--copies needs a file}; shift 2 ;;
    --list) mode=list; shift ;;
    --dry-run) dry_run=true; shift ;;
    --signatures) signatures=true; shift ;;
    --insecure) tls=(--tls-verify=false); shift ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "fill-mirror: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done

# Each line once, in order (bash alone: the AWS CLI's image has no awk).
unique_lines() {
  local -A seen=()
  local line
  while IFS= read -r line; do
    [[ -n $line && -z ${seen[$line]:-} ]] || continue
    seen[$line]=1
    printf '%s\n' "$line"
  done
}

from_files=false
((${#reports[@]} + ${#pods[@]})) && from_files=true

# `kubectl get`, its output on stdout; a kind this cluster does not serve is an empty answer
# with a note, any other failure (RBAC, an unreachable API server) ends the run with kubectl's
# own words.
kubectl_get() {
  local output
  if output=$(kubectl get "$@" -o json 2>&1); then
    printf '%s\n' "$output"
  elif grep -q "the server doesn't have a resource type" <<<"$output"; then
    echo "fill-mirror: $1 is not served by this cluster, skipped" >&2
  else
    echo "fill-mirror: kubectl get $*: $output" >&2
    return 2
  fi
}

# The reports as JSON documents, one after another: from files, or from the cluster (each kind
# that is installed).
read_reports() {
  if $from_files; then
    ((${#reports[@]})) && cat "${reports[@]}"
    return 0
  fi
  kubectl_get reports.openreports.io --all-namespaces || exit 2
  kubectl_get policyreports.wgpolicyk8s.io --all-namespaces || exit 2
}

# The Pods that carry the record, as JSON documents.
read_pods() {
  if $from_files; then
    ((${#pods[@]})) && cat "${pods[@]}"
    return 0
  fi
  kubectl_get pods --all-namespaces -l image-swapper.kubewarden.io/unmirrored=true || exit 2
}

# The swapping policy's settings, which route the Pods' copies.
read_settings() {
  local settings
  settings=$(read_settings_document)
  if ! jq -e 'type == "object" and ((.mirrors | type) == "array" or (.defaultMirror | type) == "object")' \
      <<<"$settings" >/dev/null; then
    echo "fill-mirror: the swapping policy's settings have neither mirrors nor defaultMirror: $settings" >&2
    exit 2
  fi
  printf '%s\n' "$settings"
}

read_settings_document() {
  if [[ -n $settings_file ]]; then
    jq 'if has("spec") then .spec.settings else . end' "$settings_file"
  elif $from_files; then
    echo "fill-mirror: --pods needs --settings (the swapping policy's settings) to check its copies" >&2
    exit 2
  else
    kubectl_get clusteradmissionpolicies.policies.kubewarden.io "$swap_policy" | jq '.spec.settings' || exit 2
  fi
}

# "SOURCE DESTINATION" for every Pod record whose copy is the policy's own; a note on stderr for
# each that is not. The reference rules are the container runtimes' (docker.io, library/,
# :latest), as the policy normalises them.
pod_copies() {
  local documents settings
  documents=$(read_pods)
  [[ -n $documents ]] || return 0
  settings=$(read_settings)
  jq -r --argjson settings "$settings" '
    def normal:
      (split("@")) as $at | $at[0] as $named | ($at[1] // null) as $digest
      | ($named | split("/")) as $segments
      | (if ($segments | length) > 1 and ($segments[0] | test("[.:]") or . == "localhost")
         then $named else "docker.io/" + $named end)
      | (if startswith("docker.io/") and (split("/") | length) == 2
         then "docker.io/library/" + .[10:] else . end)
      | split("/") as $s | ($s[-1] | split(":")) as $last
      | {name: (($s[:-1] + [$last[0]]) | join("/")), tag: $last[1], digest: $digest};
    def segments_under($prefix): . == $prefix or startswith($prefix + "/");
    def route($name):
      ([$settings.mirrors[]? | {source, target: (.target // .targets[0].target)}
        | select(.source != null and .target != null) | .source as $source
        | select($name | segments_under($source))]
       | max_by(.source | length)) as $rule
      | if $rule then $rule.target + $name[($rule.source | length):]
        else ($settings.defaultMirror // {}) as $d | ($d.registry // $d.registries[0]?) as $r
          | if $r and ($name | split("/")[0]) != ($r | split("/")[0])
            then $r + "/" + $name else null end
        end;
    (if type == "object" and has("items") then .items[] else . end)
    | . as $pod
    | ([.spec.containers[]?, .spec.initContainers[]?, .spec.ephemeralContainers[]?]
       | map({(.name): .image}) | add // {}) as $running
    | (.metadata.annotations["image-swapper.kubewarden.io/unmirrored-images"] // "{}"
       | try fromjson catch {}) | to_entries[]
    | .key as $container | .value as $entry
    | ($entry.copy // "" | capture("^skopeo copy --all --preserve-digests docker://(?<source>[A-Za-z0-9._:@/-]+) docker://(?<destination>[A-Za-z0-9._:@/-]+)$")
       // null) as $copy
    | ($running[$container] // null) as $image
    | ($image | if . then normal else null end) as $ref
    | (if $ref then route($ref.name) else null end) as $repository
    | (if $ref == null or $repository == null then null
       elif $ref.digest then [$ref.name + "@" + $ref.digest,
                              $repository + ":" + ($ref.digest | sub(":"; "-"))]
       else [$ref.name + ":" + ($ref.tag // "latest"), $repository + ":" + ($ref.tag // "latest")] end) as $expected
    | if $copy and $image == $entry.source and $expected == [$copy.source, $copy.destination]
      then "\($copy.source) \($copy.destination)",
        # With signatures: the cosign signature tag of the digest of the image, from the source
        # repository to the mirror repository the image routes to, and nothing else.
        (($entry.signatureCopy // "" | capture("^skopeo copy --all --preserve-digests docker://(?<source>[A-Za-z0-9._:@/-]+) docker://(?<destination>[A-Za-z0-9._:@/-]+)$")
          // null) as $signature
         | "[:]sha256-[0-9a-f]{64}[.]sig$" as $tag
         | if $signature == null then empty
           elif ($signature.source | test($tag)) and ($signature.destination | test($tag))
             and ($signature.source | sub($tag; "")) == $ref.name
             and ($signature.destination | sub($tag; "")) == $repository
             and ($signature.source | split(":") | last) == ($signature.destination | split(":") | last)
           then "\($signature.source) \($signature.destination)"
           else "refused \($pod.metadata.namespace // "")/\($pod.metadata.name // "") container \($container): its signature copy is not the policy\u0027s own (\($entry.signatureCopy))" end)
      else "refused \($pod.metadata.namespace // "")/\($pod.metadata.name // "") container \($container): its record is not the policy\u0027s own (\($entry.copy // "no copy"))" end
  ' <<<"$documents" | while read -r line; do
    if [[ $line == refused\ * ]]; then
      echo "fill-mirror: ${line}, not run" >&2
    else
      echo "$line"
    fi
  done
}

# "SOURCE DESTINATION" for every copy in this policy's fail results and the Pods' records,
# each once, in order.
list_copies() {
  { report_copies; pod_copies; } | unique_lines
}

report_copies() {
  local messages
  messages=$(read_reports |
    jq -r --arg policy "$policy" '
      (if type == "object" and has("items") then .items[] else . end)
      | .results[]?
      | select(.policy == $policy and .result == "fail")
      | .message // empty')
  { grep -oE 'skopeo copy --all --preserve-digests docker://[A-Za-z0-9._:@/-]+ docker://[A-Za-z0-9._:@/-]+' <<<"$messages" || true; } |
    sed -E 's|^skopeo copy --all --preserve-digests docker://([^ ]+) docker://([^ ]+)$|\1 \2|'
}

if [[ $mode == list ]]; then
  list_copies
  exit 0
fi

if [[ -n $copies_file ]]; then
  copies=$(unique_lines <"$copies_file")
else
  copies=$(list_copies)
fi

# ECR: the region of a registry host, and a login per destination registry, from the job's own
# AWS identity, before anything is inspected or pushed.
ecr_region() {
  if [[ $1 =~ \.dkr\.ecr\.([a-z0-9-]+)\.amazonaws\.com ]]; then
    echo "${BASH_REMATCH[1]}"
  else
    echo "${AWS_REGION:-${AWS_DEFAULT_REGION:?--ecr needs AWS_REGION for $1}}"
  fi
}
# The push login for an ECR registry host, in REGISTRY_AUTH_FILE: with skopeo when there is one,
# else written as a docker config (the AWS CLI's image has no skopeo).
ecr_login() {
  local host=$1 password
  password=$(aws ecr get-login-password --region "$(ecr_region "$host")") || return 1
  if command -v skopeo >/dev/null; then
    skopeo login --username AWS --password-stdin "${tls[@]}" "$host" <<<"$password" >/dev/null
  else
    : "${REGISTRY_AUTH_FILE:?--ecr-prepare writes the login to REGISTRY_AUTH_FILE}"
    printf '{"auths":{"%s":{"auth":"%s"}}}\n' "$host" "$(printf 'AWS:%s' "$password" | base64 -w0)" \
      >"$REGISTRY_AUTH_FILE"
  fi
}
ecr_failed=()
if $ecr && ! $dry_run; then
  for host in $(while read -r _ destination; do echo "${destination%%/*}"; done <<<"$copies" | sort -u); do
    if ! ecr_login "$host"; then
      echo "fill-mirror: could not log in to $host with aws ecr get-login-password" >&2
      ecr_failed+=("$host")
    fi
  done
fi

# ECR refuses a push to a repository that does not exist: create it, with the operator's
# arguments. One that exists already is fine.
ecr_repository() {
  local destination=$1 host repository output
  host=${destination%%/*}
  repository=${destination#*/}
  repository=${repository%%[:@]*}
  # shellcheck disable=SC2086 # ECR_CREATE_REPOSITORY_ARGS holds several arguments
  if output=$(aws ecr create-repository --region "$(ecr_region "$host")" \
      --repository-name "$repository" ${ECR_CREATE_REPOSITORY_ARGS:-} 2>&1); then
    echo "created ECR repository $repository"
  elif ! grep -q RepositoryAlreadyExistsException <<<"$output"; then
    echo "fill-mirror: aws ecr create-repository $repository: $(tail -n 1 <<<"$output")" >&2
    return 1
  fi
}

if [[ $mode == ecr-prepare ]]; then
  prepared=0
  while read -r _ destination; do
    [[ -n ${destination:-} ]] || continue
    ecr_repository "$destination" || ecr_failed+=("$destination")
    prepared=$((prepared + 1))
  done <<<"$copies"
  echo "fill-mirror: ECR prepared for $prepared copies, ${#ecr_failed[@]} failed"
  exit $((${#ecr_failed[@]} > 0))
fi

# `name` of `name:tag` or `name@digest`: a tag follows the last `:` after the last `/`.
repository_of() {
  local name=${1%@*}
  if [[ ${name##*/} == *:* ]]; then name=${name%:*}; fi
  echo "$name"
}

# With --signatures: the cosign signature of the image now at docker://$2, from $1's repository.
copy_signature() {
  local source=$1 destination=$2 raw hex tag from to output
  [[ $destination != *.sig ]] || return 0
  raw=$(skopeo inspect --raw "${tls[@]}" "docker://$destination" 2>/dev/null) || return 0
  hex=$(printf '%s' "$raw" | sha256sum | cut -d' ' -f1)
  tag="sha256-$hex.sig"
  from="$(repository_of "$source"):$tag"
  to="$(repository_of "$destination"):$tag"
  if ! skopeo inspect --raw "${tls[@]}" "docker://$from" >/dev/null 2>&1; then
    echo "no signature docker://$from to copy"
    return 0
  fi
  if skopeo inspect --raw "${tls[@]}" "docker://$to" >/dev/null 2>&1; then
    echo "skipped docker://$to: it exists already"
    return 0
  fi
  if output=$(skopeo copy --all --preserve-digests \
      ${tls:+--src-tls-verify=false --dest-tls-verify=false} \
      "docker://$from" "docker://$to" 2>&1); then
    echo "copied docker://$from to docker://$to"
    copied=$((copied + 1))
  else
    echo "failed docker://$from to docker://$to: $(tail -n 1 <<<"$output")"
    failed=$((failed + 1))
  fi
}

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
    if $signatures; then copy_signature "$source" "$destination"; fi
    continue
  fi
  if $ecr && ! ecr_repository "$destination"; then
    echo "failed docker://$source to docker://$destination: its ECR repository could not be created"
    failed=$((failed + 1))
    continue
  fi
  if output=$(skopeo copy --all --preserve-digests \
      ${tls:+--src-tls-verify=false --dest-tls-verify=false} \
      "docker://$source" "docker://$destination" 2>&1); then
    echo "copied docker://$source to docker://$destination"
    copied=$((copied + 1))
    if $signatures; then copy_signature "$source" "$destination"; fi
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
((failed == 0 && ${#ecr_failed[@]} == 0))
