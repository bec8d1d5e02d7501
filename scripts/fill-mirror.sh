#!/usr/bin/env bash
# Fills the mirror from Kubewarden's reports and the swapping policy's records on Pods: finds
# the copies they give, checks each against the swapping policy's settings, removes duplicates,
# and runs them with skopeo. It ends with one summary line and an exit status an alert can
# follow (below).
#
# The reports are Kubewarden's audit scanner's (kubewarden-controller internal/audit-scanner
# report/openreports.go and policyreports.go): `openreports.io` Reports (the Helm chart's default)
# and `wgpolicyk8s.io` PolicyReports, each with `.results[]` of {policy: the policy's unique id,
# result: pass | fail | error, message, ...}. The id is `clusterwide-<name>` before Kubewarden
# 1.37.2 and `kw.cap.<name>` from 1.37.2 on (`namespaced-<ns>-<name>` / `kw.ap.<ns>.<name>` for
# an AdmissionPolicy). A copy is the form the policy writes in a message, and nothing else is
# read from it:
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
# a new image is copied within this job's period, not the audit scanner's.
#
# Anyone who can write a Pod's annotations could write such a record, and anyone who can write
# a report could write a result; neither may stop the run or steer a copy. So every copy is
# checked against the swapping policy's settings before it is run: its destination is where the
# settings route its source (the longest matching `source`, else `defaultMirror`; never an
# image `exclude` matches, nor one already under a target), a copy by digest goes to the
# digest's own tag (sha256-<hex>) and a copy by tag to the same tag; a Pod's copy must moreover
# be the one the policy writes for what the container runs (its first target). A record or
# report that is not well formed is skipped, and a copy that fails the checks is refused, each
# with one line that names the Pod or the report and why; the run goes on.
#
# Usage:
#   fill-mirror.sh [--policy ID]... [--reports FILE]... [--pods FILE]... [--settings FILE]
#                  [--swap-policy NAME] [--ecr] [--dry-run] [--insecure] [--signatures]
#                  [--source-auth FILE]
#       Reads the reports and the Pods' records (from FILEs, `kubectl get ... -o json` output;
#       without --reports or --pods, both from the cluster with kubectl), then copies. Needs jq,
#       skopeo, and kubectl without files.
#   fill-mirror.sh --list [...]
#       Prints the copies, one "SOURCE DESTINATION" a line, on stdout; the lines of what it
#       skipped or refused go to stderr, then "fill-mirror: listed N copies, R refused" when
#       there were any (needs jq, and kubectl without files).
#   fill-mirror.sh --copies FILE [--ecr] [--dry-run] [--insecure] [--signatures] [--source-auth FILE]
#       Copies what --list printed (needs skopeo only, and the AWS CLI with --ecr): a job can
#       read the reports in one container and copy in another.
#   fill-mirror.sh --watch --spool DIR [--settings FILE | --swap-policy NAME] [--policy ID]...
#                  [--reports-every SECONDS]
#       The watch mode's watcher (kubectl and jq): lists the Pods that carry the record, follows
#       them with a watch (resuming from the last resourceVersion, listing again on 410 Gone or
#       when the watch cannot resume), checks each record's copies as --list does and queues
#       each once in DIR; removes a Pod's entries once the mirror holds them (one JSON patch that
#       tests the record, and removes the label with the last entry). Every --reports-every
#       seconds (600) it reads the settings, the reports and the Pods again as --list does.
#   fill-mirror.sh --copier --spool DIR [--jobs N] [--retry SECONDS] [--prepared] [--ecr]
#                  [--insecure] [--signatures] [--source-auth FILE]
#       The watch mode's copier (skopeo): makes the queued copies with --copies, at most --jobs
#       (4) at once; a source registry that answers 429 or 5xx gets none of its copies for
#       --retry seconds (10), doubled at each such answer up to 300, and another failed copy is
#       retried so too. --prepared: only the copies the ECR step prepared.
#   fill-mirror.sh --ecr-prepare --spool DIR
#       The watch mode's ECR step (the AWS CLI and bash): creates each queued copy's repository,
#       logs in to its registry (again every 6 hours), and hands it to the copier.
# --policy: the check policy's id in the reports' results; each --policy adds one, and without
# it both ids of a ClusterAdmissionPolicy named image-swapper-check are read,
# clusterwide-image-swapper-check (before 1.37.2) and kw.cap.image-swapper-check (1.37.2 on).
# The swapping policy's settings route the copies, the reports' and the Pods': --settings FILE
# (its settings, or the policy object, as JSON; needed with --reports or --pods), else from the
# cluster, the ClusterAdmissionPolicy --swap-policy (default image-swapper). --insecure lets
# skopeo use plain HTTP and unverified TLS. skopeo reads the mirror's push credentials, and any
# source's, from REGISTRY_AUTH_FILE (a docker config.json).
# --source-auth FILE (or FILL_SOURCE_AUTH_FILE): a docker config with the sources' credentials
# (a mounted kubernetes.io/dockerconfigjson Secret), merged into REGISTRY_AUTH_FILE before
# anything is copied: its `auths` entries are added, one per host, and the file's other
# entries kept. An entry for a host the job logs in to with --ecr is replaced by that login.
# --ecr: the mirror is Amazon ECR, which refuses a push to a repository that does not exist.
# Each destination repository is created first when missing (`aws ecr create-repository`, with
# the extra arguments in ECR_CREATE_REPOSITORY_ARGS, e.g. "--image-tag-mutability IMMUTABLE
# --encryption-configuration encryptionType=KMS"), and skopeo is logged in to each destination
# registry with `aws ecr get-login-password` at every run, from the job's own AWS identity (IRSA
# or EKS Pod Identity): no push Secret to renew. The region is the registry host's
# (<account>.dkr.ecr.<region>.amazonaws.com), else AWS_REGION.
#   fill-mirror.sh --ecr-prepare --copies FILE [--source-auth FILE]
#       The ECR part alone, for a container with the AWS CLI and no skopeo (the public AWS CLI
#       image): creates the missing repositories of the copies in FILE and merges the push
#       login of each registry host into REGISTRY_AUTH_FILE, for a later `--copies FILE` run in
#       the skopeo image. A repository it cannot create, or a host it cannot log in to, is
#       named and left to the copies, which fail and say so: it exits 0 for them.
# --signatures: with the swapping policy's `signatures`, also copy each image's cosign
# signature: once the image is in the mirror (copied, or there already), the tag
# sha256-<hex>.sig of its digest (the digest of the manifest the mirror now serves) is copied
# from the source repository to the mirror repository, when the source has it and the mirror
# does not. The policy swaps only to copies that verify, so without it a signed image is never
# swapped until something else copies its signature. The policy's own signature copies (the
# check role's findings, a record's signatureCopy) are made with or without it.
#
# The summary: "fill-mirror: C copied, F failed, S skipped, G gone, R refused". A copy whose
# source registry answers that it has no such image (manifest or repository unknown) is "gone":
# one line names it, and no run can copy it until someone pushes it again or the Pods that name
# it change. The exit status:
#   0  every copy was made or is there already, or its source is gone; skipped and refused
#      records and report entries are counted in the summary and do not change it (anyone who
#      can write a Pod could otherwise keep the job failing, and hide a real failure);
#   1  a copy, an ECR login or an ECR repository failed: the next run tries again;
#   2  the job could not run (arguments, kubectl, the settings, input that is not JSON).
set -euo pipefail

policies=()
swap_policy=image-swapper
settings_file=
ecr=false
pods=()
reports=()
copies_file=
mode=copy
dry_run=false
signatures=false
source_auth=${FILL_SOURCE_AUTH_FILE:-}
tls=()
spool=
jobs=4
retry=10
reports_every=600
prepared=false
# The arguments a watch passes on: to its `--list` runs (the watcher) or `--copies` runs (the
# copier).
list_args=()
copy_args=()

while (($#)); do
  case $1 in
    --watch) mode=watch; shift ;;
    --copier) mode=copier; shift ;;
    --spool) spool=${2:?--spool needs a directory}; shift 2 ;;
    --jobs) jobs=${2:?--jobs needs a number}; shift 2 ;;
    --retry) retry=${2:?--retry needs seconds}; shift 2 ;;
    --reports-every) reports_every=${2:?--reports-every needs seconds}; shift 2 ;;
    --prepared) prepared=true; shift ;;
    --policy) policies+=("${2:?--policy needs an id}"); list_args+=("$1" "$2"); shift 2 ;;
    --reports) reports+=("${2:?--reports needs a file}"); shift 2 ;;
    --pods) pods+=("${2:?--pods needs a file}"); shift 2 ;;
    --settings) settings_file=${2:?--settings needs a file}; shift 2 ;;
    --swap-policy) swap_policy=${2:?--swap-policy needs a name}; shift 2 ;;
    --ecr) ecr=true; copy_args+=("$1"); shift ;;
    --ecr-prepare) ecr=true; mode=ecr-prepare; shift ;;
    --copies) copies_file=${2:?--copies needs a file}; shift 2 ;;
    --list) mode=list; shift ;;
    --dry-run) dry_run=true; shift ;;
    --signatures) signatures=true; copy_args+=("$1"); shift ;;
    --source-auth) source_auth=${2:?--source-auth needs a file}; copy_args+=("$1" "$2"); shift 2 ;;
    --insecure) tls=(--tls-verify=false); copy_args+=("$1"); shift ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "fill-mirror: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
((${#policies[@]})) || policies=(clusterwide-image-swapper-check kw.cap.image-swapper-check)

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

# The swapping policy's settings, which route every copy.
read_settings() {
  local settings
  settings=$(read_settings_document) || exit 2
  if ! jq -e 'type == "object" and ((.mirrors | type) == "array" or (.defaultMirror | type) == "object")' \
      <<<"$settings" >/dev/null 2>&1; then
    echo "fill-mirror: the swapping policy's settings have neither mirrors nor defaultMirror: $settings" >&2
    exit 2
  fi
  printf '%s\n' "$settings"
}

read_settings_document() {
  if [[ -n $settings_file ]]; then
    jq 'if type == "object" and has("spec") then .spec.settings else . end' "$settings_file" || {
      echo "fill-mirror: --settings $settings_file is not JSON" >&2
      exit 2
    }
  elif $from_files; then
    echo "fill-mirror: --reports and --pods need --settings (the swapping policy's settings) to check their copies" >&2
    exit 2
  else
    local policy
    policy=$(kubectl_get clusteradmissionpolicies.policies.kubewarden.io "$swap_policy") || exit 2
    jq '.spec.settings' <<<"$policy"
  fi
}

# The policy's reference rules and routing, in jq, for checking copies against the swapping
# policy's settings as the policy routes (src/rules.rs): the container runtimes' normalisation
# (docker.io, library/, :latest), `exclude` globs on the normalised reference, an image already
# under a target left alone, the longest matching `mirrors` source (all its targets), else
# `defaultMirror`'s registries. The settings are read once into $routing (routing_of). Every
# definition reads any JSON without an error.
jq_routing='
  # A note is one line, whatever the data it quotes holds.
  def one_line: gsub("[[:cntrl:]]"; "?");
  def a_type: type | if . == "array" or . == "object" then "an " + . else "a " + . end;
  # What a value is, and the value itself (its start): "a number (1)".
  def quoted: "\(a_type) (\(tojson | if length > 80 then .[0:80] + "..." else . end))";
  def copy_form: "skopeo copy --all --preserve-digests docker://(?<source>[A-Za-z0-9._:@/-]+) docker://(?<destination>[A-Za-z0-9._:@/-]+)";
  def normal:
    (split("@")) as $at | $at[0] as $named | ($at[1] // null) as $digest
    | ($named | split("/")) as $segments
    | (if ($segments | length) > 1 and ($segments[0] | test("[.:]") or . == "localhost")
       then $named else "docker.io/" + $named end)
    | (if startswith("index.docker.io/") then "docker.io/" + .[16:] else . end)
    | (if startswith("docker.io/") and (split("/") | length) == 2
       then "docker.io/library/" + .[10:] else . end)
    | split("/") as $s | ($s[-1] | split(":")) as $last
    | {name: (($s[:-1] + [$last[0]]) | join("/")), tag: $last[1], digest: $digest,
       ats: (($at | length) - 1)};
  def reference: .name + (if .tag then ":" + .tag elif .digest then "" else ":latest" end)
    + (if .digest then "@" + .digest else "" end);
  def segments_under($prefix): . == $prefix or startswith($prefix + "/");
  def glob_regex: "\\A" + (split("") | map(if . == "*" then ".*" elif . == "?" then "."
    elif test("[A-Za-z0-9]") then . else "\\" + . end) | join("")) + "\\z";
  # The settings (its input) as routing reads them: made once, then $routing for every copy.
  def routing_of:
    . as $settings
    | [$settings.mirrors[]? | objects | select((.source | type) == "string")
     | {source, targets: [.target, (.targets[]? | objects | .target)] | map(strings)}
     | select(.targets | length > 0)] as $rules
    | ($settings.defaultMirror | objects // {} | [.registry, (.registries[]?)] | map(strings)) as $defaults
    | {rules: $rules, defaults: $defaults, targets: ([$rules[].targets[]] + $defaults),
       exclude: [$settings.exclude[]? | strings | {glob: ., regex: glob_regex}]};
  def rules: $routing.rules;
  def default_registries: $routing.defaults;
  def every_target: $routing.targets;
  # Why the settings route no copy of $ref, or null.
  def unrouted($ref):
    ($ref.name) as $name
    | ([every_target[] | select(. as $t | $name | segments_under($t))] | first) as $target
    | ([$routing.exclude[] | select(.regex as $regex | [$ref | reference,
          ($ref.tag // "" | capture("\\Asha256-(?<hex>[0-9a-f]{64})[.]sig\\z")
           | "\($name)@sha256:\(.hex)")] | any(test($regex)))] | first | .glob?) as $glob
    | if $target then "\($name) lies under the target \($target) already"
      elif $glob then "\($ref | reference) is excluded by \($glob)"
      else null end;
  # The mirror repositories the settings route $ref to, the first target first; [] for none.
  def repositories($ref):
    ($ref.name) as $name
    | if unrouted($ref) then []
      else (rules | map(select(.source as $source | $name | segments_under($source)))
            | max_by(.source | length)) as $rule
        | if $rule then [$rule.targets[] + $name[($rule.source | length):]]
          else default_registries as $registries
            | if ($registries | length) > 0 and ($name | split("/")[0]) != ($registries[0] | split("/")[0])
              then [$registries[] + "/" + $name] else [] end
          end
      end;
  def route($ref): repositories($ref)[0];
  # Why the copy from $source to $destination is not one the policy writes, or null: its
  # destination is where the settings route its source, at the own tag of the digest of a copy by
  # digest, or the same tag of a copy by tag (a signature tag included).
  def copy_problem($source; $destination):
    ($source | normal) as $ref
    | ($destination | split("/")) as $parts | ($parts[-1] | split(":")) as $last
    | (($parts[:-1] + [$last[0]]) | join("/")) as $repository | ($last[1] // null) as $tag
    | repositories($ref) as $repositories
    | ($ref.tag // "latest") as $source_tag
    | if $ref.ats > 1 or ($ref.digest != null and ($ref.digest | test("\\A[a-z0-9]+:[a-f0-9]{32,}\\z") | not))
      then "its source \($source) is not an image reference"
      elif ($destination | test("@")) or ($last | length) != 2
      then "its destination \($destination) is not a repository and a tag"
      elif ($repositories | length) == 0
      then (unrouted($ref) // "no rule of the settings routes \($ref.name)")
      elif ($repositories | index([$repository])) == null
      then "the settings route \($ref.name) to \($repositories | join(" or ")), not \($repository)"
      elif $ref.digest and $tag != ($ref.digest | sub(":"; "-"))
      then "a copy by digest goes to the digest\u0027s own tag \($ref.digest | sub(":"; "-")), not \($tag)"
      elif ($ref.digest | not) and $tag != $source_tag
      then "a copy by tag goes to the same tag \($source_tag), not \($tag)"
      else null end;
'

# Lines of the work list: "SOURCE DESTINATION" for each copy, "! NOTE" for each record, report
# or copy skipped or refused, from jq's lines ("copy S D", or a note).
work_lines() {
  local line
  while IFS= read -r line; do
    if [[ $line =~ ^copy\ ([A-Za-z0-9._:@/-]+\ [A-Za-z0-9._:@/-]+)$ ]]; then
      printf '%s\n' "${BASH_REMATCH[1]}"
    elif [[ -n $line ]]; then
      printf '! %s\n' "$line"
    fi
  done
}

# The copies of the Pods' records whose copy is the policy's own; a note for each that is not,
# and for each record that is not well formed (one line for its Pod, none of it run).
pod_copies() {
  local routing=$1 documents=$2
  [[ -n $documents ]] || return 0
  jq -r --argjson routing "$routing" "$jq_routing"'
    def where: "\(.metadata.namespace? // "" | tostring)/\(.metadata.name? // "" | tostring)";
    def entry_problem:
      .key as $container | .value
      | if type != "object" then "container \($container | tojson) is \(quoted), not an object with source and copy"
        elif (.source | type) != "string" then "container \($container | tojson): source is \(.source | quoted), not a string"
        elif (.copy | type) != "string" then "container \($container | tojson): copy is \(.copy | quoted), not a string"
        elif has("signatureCopy") and (.signatureCopy | type) != "string"
        then "container \($container | tojson): signatureCopy is \(.signatureCopy | quoted), not a string"
        else empty end;
    def own_copies:
      . as $pod
      | ([.spec.containers[]?, .spec.initContainers[]?, .spec.ephemeralContainers[]?]
         | map(objects | select((.name | type) == "string") | {(.name): .image}) | add // {}) as $running
      | .metadata.annotations["image-swapper.kubewarden.io/unmirrored-images"] as $text
      | ($text | try fromjson catch null) as $record
      | if ($record | type) != "object"
        then "skipped \($pod | where): its record is not a JSON object (\($text | tostring | .[0:120] | tojson)), none of it run"
        elif ([$record | to_entries[] | entry_problem] | length) > 0
        then "skipped \($pod | where): its record is not well formed (\([$record | to_entries[] | entry_problem] | first)), none of it run"
        else $record | to_entries[]
        | .key as $container | .value as $entry
        | ($entry.copy | capture("\\A" + copy_form + "\\z") // null) as $copy
        | ($running[$container] // null) as $image
        | ($image | if type == "string" then normal else null end) as $ref
        | (if $ref then route($ref) else null end) as $repository
        | (if $ref == null or $repository == null then null
           elif $ref.digest then [$ref.name + "@" + $ref.digest,
                                  $repository + ":" + ($ref.digest | sub(":"; "-"))]
           else [$ref.name + ":" + ($ref.tag // "latest"), $repository + ":" + ($ref.tag // "latest")] end) as $expected
        | if $copy and $image == $entry.source and $expected == [$copy.source, $copy.destination]
          then "copy \($copy.source) \($copy.destination)",
            # With signatures: the cosign signature tag of the digest of the image, from the
            # source repository to the mirror repository the image routes to, and nothing else.
            (($entry.signatureCopy // "" | capture("\\A" + copy_form + "\\z") // null) as $signature
             | "[:]sha256-[0-9a-f]{64}[.]sig\\z" as $tag
             | if $signature == null then empty
               elif ($signature.source | test($tag)) and ($signature.destination | test($tag))
                 and ($signature.source | sub($tag; "")) == $ref.name
                 and ($signature.destination | sub($tag; "")) == $repository
                 and ($signature.source | split(":") | last) == ($signature.destination | split(":") | last)
               then "copy \($signature.source) \($signature.destination)"
               else "refused \($pod | where) container \($container): its signature copy is not the policy\u0027s own (\($entry.signatureCopy)), not run" end)
          else "refused \($pod | where) container \($container): its record is not the policy\u0027s own (\($entry.copy)), not run" end
        end;
    (if type == "object" and has("items") then .items[] else . end)
    | . as $pod
    | (try ($pod | where) catch "?/?") as $where
    | if ($pod | type) != "object" then "skipped a Pod that is not an object (\($pod | tojson | .[0:120])), not read"
      elif ($pod.metadata.annotations?["image-swapper.kubewarden.io/unmirrored-images"]? // null) == null then empty
      else (try [$pod | own_copies] catch ["skipped \($where): its record could not be read (\(.)), none of it run"]) | .[]
      end
    | if startswith("copy ") then . else one_line end
  ' <<<"$documents" | work_lines || {
    echo "fill-mirror: the Pods are not JSON (kubectl get pods -o json output)" >&2
    exit 2
  }
}

# The copies in the check policy's fail results, each checked as the Pods' are; a note for
# each that is refused, and for each report or result that is not well formed.
report_copies() {
  local routing=$1 documents=$2 ids
  [[ -n $documents ]] || return 0
  ids=$(printf '%s\n' "${policies[@]}" | jq -R . | jq -s .)
  jq -r --argjson routing "$routing" --argjson ids "$ids" "$jq_routing"'
    def where: "\(.kind? // "report" | tostring) \(.metadata.namespace? // "" | tostring)/\(.metadata.name? // "" | tostring)";
    def copies($where):
      (.results // []) as $results
      | if ($results | type) != "array" then "skipped \($where): its results are \($results | quoted), not a list, not read"
        else $results | to_entries[] | .key as $i | .value
        | if type != "object" then "skipped \($where): results[\($i)] is \(quoted), not an object, not read"
          elif (.policy as $id | $ids | index([$id])) == null or .result != "fail" then empty
          elif (.message | type) != "string"
          then "skipped \($where): results[\($i)] of \(.policy): message is \(.message | quoted), not a string, not read"
          else .policy as $id | .message | [scan(copy_form)][] as [$source, $destination]
            | copy_problem($source; $destination) as $problem
            | if $problem == null then "copy \($source) \($destination)"
              else "refused \($where) results[\($i)] of \($id): its copy docker://\($source) docker://\($destination) is not the policy\u0027s own: \($problem), not run" end
          end
        end;
    (if type == "object" and has("items") then .items[] else . end)
    | . as $report
    | if type != "object" then "skipped a report that is not an object (\(tojson | .[0:120])), not read"
      else (try ($report | where) catch "report ?/?") as $where
        | (try [$report | copies($where)] catch ["skipped \($where): it could not be read (\(.))"]) | .[]
      end
    | if startswith("copy ") then . else one_line end
  ' <<<"$documents" | work_lines || {
    echo "fill-mirror: the reports are not JSON (kubectl get reports -o json output)" >&2
    exit 2
  }
}

# The work list of the reports and the Pods' records: each line once, in order. The settings are
# read only when there is something to check.
work_list() {
  local from_reports from_pods settings routing
  from_reports=$(read_reports) || exit 2
  from_pods=$(read_pods) || exit 2
  [[ -n $from_reports || -n $from_pods ]] || return 0
  settings=$(read_settings) || exit 2
  routing=$(jq -c --argjson routing null "$jq_routing routing_of" <<<"$settings") || exit 2
  { report_copies "$routing" "$from_reports" && pod_copies "$routing" "$from_pods"; } | unique_lines
}

# The work list of a --copies FILE: its "SOURCE DESTINATION" lines, each once; a note for any
# other line.
copies_from_file() {
  local line n=0
  while IFS= read -r line || [[ -n $line ]]; do
    n=$((n + 1))
    [[ -n $line ]] || continue
    if [[ $line =~ ^[A-Za-z0-9._:@/-]+\ [A-Za-z0-9._:@/-]+$ ]]; then
      printf '%s\n' "$line"
    else
      printf '! skipped line %d of %s: not "SOURCE DESTINATION" (%.120s), not run\n' "$n" "$1" "$line"
    fi
  done <"$1" | unique_lines
}

# The watch mode (docs/operations.md, "Filling the mirror"): a watcher with kubectl and jq
# (--watch) and a copier with skopeo (--copier), sharing a spool directory, since no public image
# has all three. The watcher lists the Pods that carry the record, follows them with a watch
# from the list's resourceVersion, checks each record's copies with this script's own --list
# (the same checks as a run), and queues each accepted copy once; the copier runs at most --jobs
# of them at once with this script's own --copies. A copy is a file named after the copy's
# sha256, written atomically (a rename): queue/ (or ready/ with --prepared, after the ECR step),
# in-flight/ while the copier runs it, done/ once the mirror holds it (copied, or there already),
# gone/ when its source has no such image. done/ and gone/ are remembered for --reports-every
# seconds. The watcher then removes the filled entries from each Pod's record, and the label with
# the last, in one JSON patch that tests the record it read.
watch_selector=image-swapper.kubewarden.io%2Funmirrored
watch_record=image-swapper.kubewarden.io~1unmirrored-images
watch_label=image-swapper.kubewarden.io~1unmirrored

now_seconds() { printf '%(%s)T' -1; }
# Milliseconds since the epoch (bash 5's EPOCHREALTIME).
now_ms() { local t=${EPOCHREALTIME/[.,]/}; echo $((10#${t:0:-3})); }

# The spool's name of a copy line, in REPLY (cached: one sha256sum per copy).
declare -A spool_keys=()
spool_key() {
  if [[ -z ${spool_keys[$1]:-} ]]; then
    local sum
    sum=$(printf '%s' "$1" | sha256sum)
    spool_keys[$1]=${sum%% *}
  fi
  REPLY=${spool_keys[$1]}
}

spool_dirs() {
  mkdir -p "$spool"/{queue,ready,in-flight,done,gone,tmp} || {
    echo "fill-mirror: --spool $spool cannot be written" >&2
    exit 2
  }
}

# Queues the copy "SOURCE DESTINATION" unless it is queued, running or finished already.
enqueue() {
  local line=$1 key dir
  spool_key "$line"
  key=$REPLY
  for dir in queue ready in-flight done gone; do
    [[ ! -e $spool/$dir/$key ]] || return 0
  done
  printf '%s\n' "$line" >"$spool/tmp/$key" && mv "$spool/tmp/$key" "$spool/queue/$key"
  echo "queued docker://${line% *} to docker://${line#* }"
}

# The notes of --list runs (refused and skipped records), each printed once.
declare -A watch_noted=()
note_once() {
  local line
  while IFS= read -r line; do
    [[ -n $line && $line != 'fill-mirror: listed '* && -z ${watch_noted[$line]:-} ]] || continue
    watch_noted[$line]=1
    printf '%s\n' "$line" >&2
  done
}

# Checks the copies of the Pods in the file $1 (JSON objects) with --list, and queues them.
queue_pods() {
  local line
  [[ -s $1 ]] || return 0
  while IFS= read -r line; do
    [[ -z $line ]] || enqueue "$line"
  done < <("$BASH" "$0" --list --pods "$1" --settings "$watch_settings" 2>"$watch_state/notes" || true)
  note_once <"$watch_state/notes"
}

# What the watcher knows of each recorded Pod (namespace/name): its record as read, and its
# entries, one "CONTAINER␟COPY␟SIGNATURE COPY" line each (␟ the unit separator; CONTAINER in JSON) (the copies as
# "SOURCE DESTINATION", empty when the entry has none in the policy's form).
declare -A pod_records=() pod_entries=() pod_pending=()
# A Pod whose marking patch failed other than by its `test` (the API server's 429, a 5xx, a
# timeout): when to send it again (epoch seconds), and the delay, 5 s doubled up to 60.
declare -A pod_retry_at=() pod_retry_delay=()
# Each recorded Pod's metadata.creationTimestamp (epoch seconds): when the policy wrote its
# record, at admission.
declare -A pod_created=()
# kubectl's words when the patch's `test` failed (the record changed since it was read: the
# API server's 422, "testing value ... failed") or the Pod is gone: it is read again at its next
# event, not sent again.
patch_final='testing value|test failed|test operation|request is invalid|rejected our request|unprocessable|\(NotFound\)|not found'
watch_rv=
watch_relist=false

# Reads the watch events in the array `batch` (one JSON event a line, or a Pod list's items
# as ADDED events): the resourceVersion, the Pods' records, an ERROR; then queues the copies.
process_events() {
  local kind key rv text container copy signature pods=$watch_state/pods.json
  ((${#batch[@]})) || return 0
  : >"$pods"
  while IFS=$'\x1f' read -r kind key rv text; do
    case $kind in
      object) printf '%s\n' "$key" >>"$pods" ;;
      rv) [[ -z $key ]] || watch_rv=$key ;;
      pod)
        [[ -z $rv ]] || watch_rv=$rv
        pod_records[$key]=$text
        pod_entries[$key]=
        pod_pending[$key]=1
        unset "pod_created[$key]"
        ;;
      created) [[ ! $rv =~ ^[0-9]+$ ]] || pod_created[$key]=$rv ;;
      entry)
        IFS=$'\x1f' read -r container copy signature <<<"$rv"$'\x1f'"$text"
        pod_entries[$key]+="$container"$'\x1f'"$copy"$'\x1f'"$signature"$'\n'
        ;;
      deleted)
        [[ -z $rv ]] || watch_rv=$rv
        unset "pod_records[$key]" "pod_entries[$key]" "pod_pending[$key]" "pod_retry_at[$key]" "pod_retry_delay[$key]" "pod_created[$key]"
        ;;
      error)
        echo "fill-mirror: the watch answered an error (code $key: $text), listing again" >&2
        watch_relist=true
        ;;
      *) echo "fill-mirror: a watch event that is not JSON, skipped: $key" >&2 ;;
    esac
  done < <(printf '%s\n' "${batch[@]}" | jq -R -r --argjson routing null "$jq_routing"'
    def where: "\(.metadata.namespace? // "" | tostring)/\(.metadata.name? // "" | tostring)";
    def form: if type == "string" then (capture("\\A" + copy_form + "\\z") // null | if . then "\(.source) \(.destination)" else "" end) else "" end;
    . as $text | (try fromjson catch null) as $event
    | if ($event | type) != "object" or ($event.type | type) != "string"
      then "unreadable\u001f\($text | .[0:120] | one_line)"
      elif $event.type == "BOOKMARK" then "rv\u001f\($event.object.metadata.resourceVersion? // "" | tostring)"
      elif $event.type == "ERROR"
      then "error\u001f\($event.object.code? // "" | tostring)\u001f\u001f\($event.object.message? // "" | tostring | one_line)"
      elif ($event.object | type) != "object" then "unreadable\u001f\($text | .[0:120] | one_line)"
      else $event.object as $pod | ($pod | where) as $key
        | ($pod.metadata.resourceVersion? // "" | tostring) as $rv
        | if $event.type == "DELETED" then "deleted\u001f\($key)\u001f\($rv)"
          else ($pod.metadata.annotations?["image-swapper.kubewarden.io/unmirrored-images"]? // null) as $record
            | "object\u001f\($pod | tojson)",
              "pod\u001f\($key)\u001f\($rv)\u001f\($record | tojson)",
              "created\u001f\($key)\u001f\($pod.metadata.creationTimestamp? // null | strings | try fromdateiso8601 catch "")",
              ($record | strings | try fromjson catch null | objects | to_entries[]
               | "entry\u001f\($key)\u001f\(.key | tojson)\u001f\(.value | objects | .copy | form)\u001f\(.value | objects | .signatureCopy | form)")
          end
      end')
  queue_pods "$pods"
}

# Whether the copy $2 (in done/ as $3) was made before Pod $1 was recorded (its creationTimestamp
# later than the done/ file): the policy found the mirror without the image after the copy, so
# the mirror lost it since (a lifecycle rule, a deletion). The copy is queued again, and the Pod
# marked only once the mirror holds it anew.
done_before_record() {
  local created=${pod_created[$1]:-} made
  [[ -n $created ]] || return 1
  made=$(stat -c %Y "$spool/done/$3" 2>/dev/null) || return 1
  ((created > made)) || return 1
  rm -f "$spool/done/$3"
  echo "fill-mirror: $1 was recorded after docker://${2#* } was made: the mirror lost it since, copying it again"
  enqueue "$2"
}

# The entries of each pending Pod whose copies the mirror now holds: one patch per Pod that
# removes them (and the label with the last), testing that the record is still the one read.
mark_records() {
  local key container copy signature filled old patch namespace name now error
  now=$(now_seconds)
  for key in "${!pod_pending[@]}"; do
    ((${pod_retry_at[$key]:-0} <= now)) || continue
    filled=()
    while IFS=$'\x1f' read -r container copy signature; do
      [[ -n $container && -n $copy ]] || continue
      spool_key "$copy"
      [[ -e $spool/done/$REPLY ]] || continue
      ! done_before_record "$key" "$copy" "$REPLY" || continue
      if [[ -n $signature ]]; then
        spool_key "$signature"
        [[ -e $spool/done/$REPLY ]] || continue
        ! done_before_record "$key" "$signature" "$REPLY" || continue
      fi
      filled+=("$container")
    done <<<"${pod_entries[$key]:-}"
    ((${#filled[@]})) || continue
    old=${pod_records[$key]}
    patch=$(printf '%s\n' "${filled[@]}" | jq -sc --argjson old "$old" '
      . as $filled | "/metadata/annotations/'"$watch_record"'" as $path
      | ($old | fromjson | with_entries(select(.key | IN($filled[]) | not))) as $kept
      | [{op: "test", path: $path, value: $old}]
        + if ($kept | length) > 0 then [{op: "replace", path: $path, value: ($kept | tojson)}]
          else [{op: "remove", path: $path}, {op: "remove", path: "/metadata/labels/'"$watch_label"'"}] end') || continue
    namespace=${key%%/*} name=${key#*/}
    # A long batch of patches is no hung watcher to the liveness probe.
    : >"$watch_state/alive"
    if kubectl patch pod -n "$namespace" "$name" --type=json -p "$patch" >/dev/null 2>"$watch_state/patch.err"; then
      unset "pod_pending[$key]" "pod_retry_at[$key]" "pod_retry_delay[$key]"
      filled=("${filled[@]//\"/}")
      echo "marked $key: the mirror holds $(IFS=,; echo "${filled[*]}")"
    else
      error=$(grep . "$watch_state/patch.err" | tail -n 1 || true)
      if grep -qiE "$patch_final" <<<"$error"; then
        unset "pod_pending[$key]" "pod_retry_at[$key]" "pod_retry_delay[$key]"
        echo "fill-mirror: could not mark $key (read again at its next event): $error" >&2
      else
        pod_retry_delay[$key]=$((${pod_retry_delay[$key]:-0} ? ${pod_retry_delay[$key]:-0} * 2 : 5))
        ((pod_retry_delay[$key] <= 60)) || pod_retry_delay[$key]=60
        pod_retry_at[$key]=$((now + pod_retry_delay[$key]))
        echo "fill-mirror: could not mark $key, again in ${pod_retry_delay[$key]}s: $error" >&2
      fi
    fi
  done
}

# Lists the recorded Pods, their records replacing what the watcher knew; retried until the
# API server answers.
relist() {
  local delay=1 list
  until list=$(kubectl get --raw "/api/v1/pods?labelSelector=$watch_selector" 2>"$watch_state/list.err"); do
    : >"$watch_state/alive"
    echo "fill-mirror: listing the recorded Pods failed, again in ${delay}s: $(grep . "$watch_state/list.err" | tail -n 1)" >&2
    sleep "$delay"
    delay=$((delay < 30 ? delay * 2 : 30))
  done
  pod_records=() pod_entries=() pod_pending=() pod_retry_at=() pod_retry_delay=() pod_created=()
  mapfile -t batch < <(jq -c '.items[]? | {type: "ADDED", object: .}' <<<"$list" || true)
  watch_rv=$(jq -r '.metadata.resourceVersion? // ""' <<<"$list" 2>/dev/null || true)
  local listed_rv=$watch_rv
  process_events
  watch_rv=$listed_rv
  watch_relist=false
  echo "fill-mirror: listed ${#pod_records[@]} recorded Pods, watching from resourceVersion $watch_rv"
}

start_watch() {
  rm -f "$watch_state/watch.rc"
  exec {watch_fd}< <(kubectl get --raw "/api/v1/pods?watch=1&allowWatchBookmarks=true&labelSelector=$watch_selector&resourceVersion=$watch_rv" \
    2>"$watch_state/watch.err"; echo $? >"$watch_state/watch.rc")
  watch_pid=$!
  watch_started=$(now_seconds) watch_events=0
}

stop_watch() {
  exec {watch_fd}<&-
  kill "$watch_pid" 2>/dev/null || true
  wait "$watch_pid" 2>/dev/null || true
}

# Up to 500 lines of the watch in `batch`: the first within 0.2 s, the next each within 0.05 s.
# A line cut by a timeout is kept for the next read; `ended` when the stream ends.
watch_partial=
read_events() {
  local line status wait=0.2
  batch=() ended=false
  while ((${#batch[@]} < 500)); do
    line= status=0
    IFS= read -r -t "$wait" -u "$watch_fd" line || status=$?
    if ((status == 0)); then
      batch+=("$watch_partial$line") watch_partial= wait=0.05
    elif ((status > 128)); then
      watch_partial+=$line
      return 0
    else
      [[ -z $watch_partial$line ]] || batch+=("$watch_partial$line")
      watch_partial= ended=true
      return 0
    fi
  done
}

read_settings_file() {
  if [[ -n $settings_file ]]; then
    watch_settings=$settings_file
  elif kubectl get clusteradmissionpolicies.policies.kubewarden.io "$swap_policy" -o json >"$watch_state/settings.new" 2>"$watch_state/settings.err"; then
    mv "$watch_state/settings.new" "$watch_state/settings.json"
    watch_settings=$watch_state/settings.json
  elif [[ -s $watch_state/settings.json ]]; then
    echo "fill-mirror: could not read the swapping policy's settings, keeping the last: $(grep . "$watch_state/settings.err" | tail -n 1)" >&2
  else
    echo "fill-mirror: could not read the swapping policy's settings: $(grep . "$watch_state/settings.err" | tail -n 1)" >&2
    exit 2
  fi
}

# Every --reports-every seconds: the settings again, the reports and the Pods through the run's
# own list, and finished copies forgotten (a copy the mirror lost since is queued again).
periodic() {
  local line settings_args=(--swap-policy "$swap_policy")
  read_settings_file
  [[ -z $settings_file ]] || settings_args=(--settings "$settings_file")
  find "$spool/done" "$spool/gone" -type f -mmin "+$(((reports_every + 59) / 60))" -delete 2>/dev/null || true
  while IFS= read -r line; do
    [[ -z $line ]] || enqueue "$line"
  done < <("$BASH" "$0" --list "${list_args[@]}" "${settings_args[@]}" 2>"$watch_state/notes" || true)
  note_once <"$watch_state/notes"
}

watch_main() {
  local failures=0 next_period rc
  [[ -n $spool ]] || { echo "fill-mirror: --watch needs --spool DIR" >&2; exit 2; }
  spool_dirs
  watch_state=$spool/watch
  mkdir -p "$watch_state"
  trap 'kill "${watch_pid:-}" 2>/dev/null; exit 0' TERM INT
  read_settings_file
  relist
  start_watch
  next_period=0
  while :; do
    : >"$watch_state/alive"
    read_events
    watch_events=$((watch_events + ${#batch[@]}))
    process_events
    if $watch_relist; then
      stop_watch
      relist
      start_watch
    elif $ended; then
      stop_watch
      rc=$(cat "$watch_state/watch.rc" 2>/dev/null || echo 1)
      if ((rc == 0)); then
        failures=0
        # A stream that ends at once, again and again, is not followed in a tight loop.
        ((watch_events > 0 || $(now_seconds) - watch_started > 1)) || sleep 1
        echo "fill-mirror: the watch ended, resuming from resourceVersion $watch_rv"
      elif grep -qiE 'too old resource version|expired|gone|410' "$watch_state/watch.err"; then
        echo "fill-mirror: the watch expired ($(grep . "$watch_state/watch.err" | tail -n 1)), listing again" >&2
        relist
      else
        # It may be the API server down, or the watch refused: resume twice, then list again.
        failures=$((failures + 1))
        if ((failures >= 3)); then
          echo "fill-mirror: the watch failed ($(grep . "$watch_state/watch.err" | tail -n 1)), listing again" >&2
          relist
          failures=0
        else
          echo "fill-mirror: the watch failed ($(grep . "$watch_state/watch.err" | tail -n 1)), again in ${failures}s" >&2
          sleep "$failures"
        fi
      fi
      start_watch
    fi
    mark_records
    if (($(now_seconds) >= next_period)); then
      periodic
      next_period=$(($(now_seconds) + reports_every))
    fi
  done
}

# The copier: runs the queued copies, at most --jobs at once, each with --copies; backs off a
# source registry that answers 429 or 5xx for --retry seconds, doubled at each answer up to 5
# minutes, and retries any other failed copy so too. A failed copy goes back to queue/, with
# --prepared too: the ECR step prepares it again (a repository it could not create is tried
# again), and the backoff holds it in ready/ after that.
# skopeo's words for a registry's 429 and 5xx answers (containers/image: "too many requests to
# registry", "invalid status code from registry 503 (Service Unavailable)", "received unexpected
# HTTP status: 502 Bad Gateway").
too_busy='too many requests|toomanyrequests|status( code)?( from registry)?:? (429|5[0-9][0-9])'
copier_main() {
  local input=queue file key source destination host now pid log line
  local -A running=() host_until=() host_delay=() key_until=() key_delay=()
  [[ -n $spool ]] || { echo "fill-mirror: --copier needs --spool DIR" >&2; exit 2; }
  $prepared && input=ready
  spool_dirs
  # Copies a copier stopped before finishing run again.
  for file in "$spool"/in-flight/*; do
    [[ -e $file && $file != *.log ]] || continue
    mv "$file" "$spool/$input/${file##*/}"
  done
  rm -f "$spool"/in-flight/*.log
  trap 'kill "${!running[@]}" 2>/dev/null; exit 0' TERM INT
  while :; do
    : >"$spool/copier.alive"
    now=$(now_ms)
    for pid in "${!running[@]}"; do
      ! kill -0 "$pid" 2>/dev/null || continue
      wait "$pid" 2>/dev/null || true
      key=${running[$pid]}
      unset "running[$pid]"
      log=$spool/in-flight/$key.log
      read -r source destination <"$spool/in-flight/$key"
      host=${source%%/*}
      grep -v '^fill-mirror: [0-9]* copied, ' "$log" || true
      if grep -qE '^(copied|skipped) docker://' "$log" && ! grep -q '^failed ' "$log"; then
        mv "$spool/in-flight/$key" "$spool/done/$key"
        unset "host_delay[$host]"
      elif grep -q '^gone ' "$log"; then
        mv "$spool/in-flight/$key" "$spool/gone/$key"
      elif grep -qiE "$too_busy" "$log"; then
        host_delay[$host]=$((${host_delay[$host]:-0} ? ${host_delay[$host]:-0} * 2 : retry))
        ((host_delay[$host] <= 300)) || host_delay[$host]=300
        host_until[$host]=$((now + host_delay[$host] * 1000))
        echo "fill-mirror: $host answered $(grep -oiE "$too_busy" "$log" | head -n 1), its copies wait ${host_delay[$host]}s"
        mv "$spool/in-flight/$key" "$spool/queue/$key"
      else
        key_delay[$key]=$((${key_delay[$key]:-0} ? ${key_delay[$key]:-0} * 2 : retry))
        ((key_delay[$key] <= 300)) || key_delay[$key]=300
        key_until[$key]=$((now + key_delay[$key] * 1000))
        echo "fill-mirror: docker://$source to docker://$destination again in ${key_delay[$key]}s"
        mv "$spool/in-flight/$key" "$spool/queue/$key"
      fi
      rm -f "$log"
    done
    for file in "$spool/$input"/*; do
      ((${#running[@]} < jobs)) || break
      [[ -e $file ]] || continue
      key=${file##*/}
      ((${key_until[$key]:-0} <= now)) || continue
      read -r source destination <"$file" || continue
      host=${source%%/*}
      ((${host_until[$host]:-0} <= now)) || continue
      mv "$file" "$spool/in-flight/$key" 2>/dev/null || continue
      "$BASH" "$0" --copies "$spool/in-flight/$key" "${copy_args[@]}" >"$spool/in-flight/$key.log" 2>&1 &
      running[$!]=$key
    done
    sleep 0.2
  done
}

case $mode in
  watch) watch_main ;;
  copier) copier_main ;;
esac

if [[ $mode == ecr-prepare && -n $spool ]]; then
  work=
elif [[ -n $copies_file ]]; then
  if [[ ! -r $copies_file ]]; then
    echo "fill-mirror: --copies $copies_file cannot be read" >&2
    exit 2
  fi
  work=$(copies_from_file "$copies_file")
else
  work=$(work_list)
fi

# The copies, and the notes printed (on stderr) and counted.
copies= refused=0
while IFS= read -r line; do
  if [[ $line == '! '* ]]; then
    echo "fill-mirror: ${line#! }" >&2
    refused=$((refused + 1))
  elif [[ -n $line ]]; then
    copies+=$line$'\n'
  fi
done <<<"${work:-}"

if [[ $mode == list ]]; then
  printf '%s' "$copies"
  # The copying step (--copies) cannot see these: count them here, in this step's log.
  if ((refused > 0)); then
    echo "fill-mirror: listed $(grep -c . <<<"$copies" || true) copies, $refused refused" >&2
  fi
  exit 0
fi
if [[ $mode == ecr-prepare && -z ${REGISTRY_AUTH_FILE:-} ]]; then
  echo "fill-mirror: --ecr-prepare writes the logins to REGISTRY_AUTH_FILE, which is not set" >&2
  exit 2
fi

# Docker configs in bash alone (the AWS CLI's image has neither jq nor skopeo). The members of
# the JSON object on stdin, one "KEY<TAB>VALUE" line each, VALUE in compact JSON: grep -o cuts
# it into tokens (strings whole, with their escapes; punctuation; literals), and only the
# nesting depth is followed.
json_members() {
  local token depth=0 key= value=
  while IFS= read -r token; do
    case $token in
      '{' | '[')
        depth=$((depth + 1))
        ((depth > 1)) || { [[ $token == '{' ]] || return 0; continue; }
        ;;
      '}' | ']') depth=$((depth - 1)) ;;
    esac
    if ((depth <= 0)); then
      [[ -z $key ]] || printf '%s\t%s\n' "$key" "$value"
      return 0
    elif ((depth == 1)); then
      case $token in
        ,) [[ -z $key ]] || printf '%s\t%s\n' "$key" "$value"; key= value= ;;
        :) ;;
        *) if [[ -z $key ]]; then key=$token; else value+=$token; fi ;;
      esac
    else
      value+=$token
    fi
  done < <(grep -oE '"([^"\\]|\\.)*"|[][{}:,]|[^][{}:,"[:space:]]+')
}

# The `auths` entries of the docker config $1 (none when it is missing or empty).
auth_entries() {
  local key value
  [[ -s $1 ]] || return 0
  while IFS=$'\t' read -r key value; do
    [[ $key != '"auths"' ]] || json_members <<<"$value"
  done < <(json_members <"$1")
}

# Writes REGISTRY_AUTH_FILE as the `auths` of the docker configs named, then the "KEY<TAB>VALUE"
# lines on stdin (fresh logins): one entry per host, a later one replacing an earlier.
merge_auth_file() {
  local file=$REGISTRY_AUTH_FILE config key value tmp entries=() order=()
  local -A values=()
  for config in "$@"; do
    while IFS=$'\t' read -r key value; do
      [[ -n ${values[$key]+set} ]] || order+=("$key")
      values[$key]=$value
    done < <(auth_entries "$config")
  done
  while IFS=$'\t' read -r key value; do
    [[ -n $key ]] || continue
    [[ -n ${values[$key]+set} ]] || order+=("$key")
    values[$key]=$value
  done
  for key in "${order[@]}"; do entries+=("$key:${values[$key]}"); done
  tmp=$(mktemp "$file.XXXXXX") || return 1
  (IFS=,; printf '{"auths":{%s}}\n' "${entries[*]}") >"$tmp" && mv "$tmp" "$file" || {
    rm -f "$tmp"
    return 1
  }
}

if [[ -n $source_auth ]] && ! $dry_run; then
  : "${REGISTRY_AUTH_FILE:?--source-auth merges into REGISTRY_AUTH_FILE}"
  if [[ ! -r $source_auth ]]; then
    echo "fill-mirror: --source-auth $source_auth cannot be read" >&2
    exit 2
  fi
  if ! merge_auth_file "$REGISTRY_AUTH_FILE" "$source_auth" </dev/null; then
    echo "fill-mirror: --source-auth: cannot write REGISTRY_AUTH_FILE $REGISTRY_AUTH_FILE (it must be writable)" >&2
    exit 2
  fi
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
# The push login for an ECR registry host, in REGISTRY_AUTH_FILE beside its other entries: with
# skopeo when there is one, else merged by hand (the AWS CLI's image has no skopeo).
ecr_login() {
  local host=$1 password
  password=$(aws ecr get-login-password --region "$(ecr_region "$host")") || return 1
  if command -v skopeo >/dev/null; then
    skopeo login --username AWS --password-stdin "${tls[@]}" "$host" <<<"$password" >/dev/null
  else
    : "${REGISTRY_AUTH_FILE:?--ecr-prepare writes the login to REGISTRY_AUTH_FILE}"
    printf '"%s"\t{"auth":"%s"}\n' "$host" "$(printf 'AWS:%s' "$password" | base64 -w0)" |
      merge_auth_file "$REGISTRY_AUTH_FILE"
  fi
}
ecr_failed=()
if $ecr && ! $dry_run; then
  for host in $(while read -r _ destination; do [[ -z ${destination:-} ]] || echo "${destination%%/*}"; done <<<"$copies" | sort -u); do
    if ! ecr_login "$host"; then
      echo "fill-mirror: could not log in to $host with aws ecr get-login-password; its copies will fail" >&2
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
    echo "fill-mirror: aws ecr create-repository $repository: $(grep . <<<"$output" | tail -n 1)" >&2
    return 1
  fi
}

# With --spool: the ECR step of the watch mode, between the watcher and the copier (the AWS CLI's
# image, no skopeo, no jq). Each queued copy's repository is created, its registry's login
# written to REGISTRY_AUTH_FILE (again every 6 hours: ECR's tokens last 12), and the copy moved
# to ready/, where a copier started with --prepared takes it.
ecr_spool_main() {
  local file source destination host now
  local -A logged=()
  spool_dirs
  trap 'exit 0' TERM INT
  while :; do
    : >"$spool/ecr.alive"
    now=$(now_seconds)
    for host in "${!logged[@]}"; do
      ((now - logged[$host] >= 21600)) || continue
      if ecr_login "$host"; then logged[$host]=$now; else logged[$host]=$((now - 21600 + 60)); fi
    done
    for file in "$spool"/queue/*; do
      [[ -e $file ]] || continue
      # Each copy may take an AWS call or two: a long queue is no hung step to the probe.
      : >"$spool/ecr.alive"
      read -r source destination <"$file" || continue
      host=${destination%%/*}
      if [[ -z ${logged[$host]:-} ]]; then
        if ecr_login "$host"; then
          logged[$host]=$now
          echo "logged in to $host"
        else
          # Again in a minute; its copies fail meanwhile, and say so.
          logged[$host]=$((now - 21600 + 60))
          echo "fill-mirror: could not log in to $host with aws ecr get-login-password; its copies will fail" >&2
        fi
      fi
      ecr_repository "$destination" || echo "fill-mirror: the copy to docker://$destination will fail" >&2
      mv "$file" "$spool/ready/${file##*/}"
    done
    sleep 0.5
  done
}
if [[ $mode == ecr-prepare && -n $spool ]]; then
  ecr_spool_main
fi

if [[ $mode == ecr-prepare ]]; then
  prepared=0 unprepared=0
  while read -r _ destination; do
    [[ -n ${destination:-} ]] || continue
    ecr_repository "$destination" || unprepared=$((unprepared + 1))
    prepared=$((prepared + 1))
  done <<<"$copies"
  # What failed here fails its copy in the next step, which names it; this step never stops it.
  echo "fill-mirror: ECR prepared for $prepared copies, $((unprepared + ${#ecr_failed[@]})) failed"
  exit 0
fi

# `name` of `name:tag` or `name@digest`: a tag follows the last `:` after the last `/`.
repository_of() {
  local name=${1%@*}
  if [[ ${name##*/} == *:* ]]; then name=${name%:*}; fi
  echo "$name"
}

# Whether the source registry says it has no such image (manifest or repository unknown): the
# copy cannot succeed until someone pushes it again. Anything else (refused credentials, an
# unreachable registry) may pass.
# It prints the registry's words for it.
source_gone() {
  local output
  if output=$(skopeo inspect --raw "${tls[@]}" "docker://$1" 2>&1 >/dev/null); then
    return 1
  fi
  grep -oiE -m 1 'manifest unknown|name unknown|repository name not known' <<<"$output" | head -n 1 | grep .
}

# What registries answer for a manifest or a repository that does not exist (skopeo prints the
# error's code, then the registry's message): distribution's "manifest unknown" and "name
# unknown" ("repository name not known to registry"), ECR's "The repository with name '...' does
# not exist in the registry ..." and "Requested image not found", Artifact Registry's `Failed to
# fetch "<tag>"` and `Repository "<name>" not found`.
absent_words='manifest unknown|name unknown|repository name not known to registry|does not exist in the registry|requested image not found|failed to fetch "|repository "[^"]*" not found'

# Whether docker://$1 exists: 0 it does, 1 its registry says it does not, 2 the registry could
# not be asked or its answer says neither (a 429, a 5xx, refused credentials, a timeout); then
# REPLY holds its words. Only "does not exist" lets a copy run: anything else could be a tag
# that exists, which a copy would move.
exists() {
  local output
  if output=$(skopeo inspect --raw "${tls[@]}" "docker://$1" 2>&1 >/dev/null); then
    return 0
  fi
  if grep -qiE "$absent_words" <<<"$output"; then
    return 1
  fi
  REPLY=$(grep . <<<"$output" | tail -n 1 || true)
  REPLY=${REPLY:-skopeo inspect failed with no output}
  return 2
}

# With --signatures: the cosign signature of the image now at docker://$2, from $1's repository.
copy_signature() {
  local source=$1 destination=$2 raw hex tag from to output status
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
  status=0
  exists "$to" || status=$?
  if ((status == 0)); then
    echo "skipped docker://$to: it exists already"
    return 0
  elif ((status == 2)); then
    echo "failed docker://$from to docker://$to: could not tell whether docker://$to exists: $REPLY"
    failed=$((failed + 1))
    return 0
  fi
  if output=$(skopeo copy --all --preserve-digests \
      ${tls:+--src-tls-verify=false --dest-tls-verify=false} \
      "docker://$from" "docker://$to" 2>&1); then
    echo "copied docker://$from to docker://$to"
    copied=$((copied + 1))
  else
    echo "failed docker://$from to docker://$to: $(grep . <<<"$output" | tail -n 1)"
    failed=$((failed + 1))
  fi
}

copied=0 failed=0 skipped=0 gone=0
while read -r source destination; do
  [[ -n ${source:-} && -n ${destination:-} ]] || continue
  if $dry_run; then
    echo "would copy docker://$source to docker://$destination"
    continue
  fi
  status=0
  exists "$destination" || status=$?
  if ((status == 0)); then
    echo "skipped docker://$destination: it exists already"
    skipped=$((skipped + 1))
    if $signatures; then copy_signature "$source" "$destination"; fi
    continue
  elif ((status == 2)); then
    echo "failed docker://$source to docker://$destination: could not tell whether docker://$destination exists: $REPLY"
    failed=$((failed + 1))
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
  elif answer=$(source_gone "$source"); then
    echo "gone docker://$source: its registry has no such image ($answer), nothing to copy to docker://$destination"
    gone=$((gone + 1))
  else
    echo "failed docker://$source to docker://$destination: $(grep . <<<"$output" | tail -n 1)"
    failed=$((failed + 1))
  fi
done <<<"$copies"

if $dry_run; then
  echo "fill-mirror: dry run, $(grep -c . <<<"$copies" || true) copies, none made"
  exit 0
fi
echo "fill-mirror: $copied copied, $failed failed, $skipped skipped, $gone gone, $refused refused"
if ((failed > 0 || ${#ecr_failed[@]} > 0)); then exit 1; fi
exit 0
