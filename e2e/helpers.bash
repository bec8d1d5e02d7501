# Runs one case of e2e/cases/ under `kwctl run` (KWCTL, default `kwctl`), with the case's
# recorded host interactions, and checks the answer against the case's expect.json.
# tests/e2e_recordings.rs replays the same files in the project's own wasm host, so both
# runners hold the same contract.
bats_require_minimum_version 1.5.0

KWCTL=${KWCTL:-kwctl}
POLICY=${POLICY:-annotated-policy.wasm}
# Real kwctl with Sigstore's trusted root from a file (make e2e-tests passes the real tools'),
# so that no run tries to fetch it.
TRUST=()
[[ -n ${SIGSTORE_TRUST_CONFIG:-} ]] && TRUST=(--sigstore-trust-config "$SIGSTORE_TRUST_CONFIG")

# A case, then its sibling (the case its `sibling` file names) under the case's settings: a
# request a policy that accepts everything unchanged would answer wrongly, given to the cases
# such a policy would pass, so that they fail when the policy does not run.
check_case() {
  local dir="e2e/cases/$1"
  check_answer "$dir" "$dir/settings.yml"
  if [[ -f $dir/sibling ]]; then
    check_answer "e2e/cases/$(<"$dir/sibling")" "$dir/settings.yml"
  fi
}

check_answer() {
  local dir=$1 settings=$2
  local expect="$dir/expect.json"
  run --separate-stderr "$KWCTL" run "${TRUST[@]}" \
    --request-path "$dir/request.json" \
    --settings-path "$settings" \
    --replay-host-capabilities-interactions "$dir/session.yml" \
    --allow-context-aware \
    "$POLICY"
  echo "status: $status"
  echo "stdout: $output"
  echo "stderr: $stderr"

  # Not `.settingsValid // true`: jq's `//` takes false for missing.
  if [[ $(jq -r '.settingsValid == false' "$expect") == true ]]; then
    [ "$status" -eq 1 ]
    [[ "$stderr" == *"Provided settings are not valid"* ]]
    # kwctl prints the settings verdict as JSON on stdout, then the error on stderr with the
    # message in Rust's debug form (quotes escaped): compare the JSON's message.
    jq -e --arg m "$(jq -r .message "$expect")" '.valid == false and (.message | contains($m))' <<<"$output"
    return 0
  fi

  [ "$status" -eq 0 ]
  [ "$(jq -r .allowed <<<"$output")" == "$(jq -r .allowed "$expect")" ]

  if [[ $(jq -r '.patch == null' "$expect") == true ]]; then
    # No patch at all: nothing changes when the policy has nothing to change. (Not `! jq ...`:
    # bash's errexit ignores a negated command, so in bats it could never fail.)
    if jq -er .patch <<<"$output" >/dev/null; then
      echo "unexpected patch: $(jq -r '.patch | @base64d' <<<"$output")"
      return 1
    fi
  else
    # The whole JSON patch: every operation's op, path and value, in order, no more and no
    # fewer (a policy that also rewrote something else, or the same with another op, fails).
    local want got
    want=$(jq -cS '.patch' "$expect")
    got=$(jq -cS '.patch // empty | @base64d | fromjson' <<<"$output")
    echo "patch: want $want"
    echo "patch: got  $got"
    [ "$got" == "$want" ]
  fi

  # The record of unmirrored images is added exactly when the case expects it.
  local labelled
  labelled=$(jq '[.patch // [] | .[] | select(.path == "/metadata/labels" and (.value | has("image-swapper.kubewarden.io/unmirrored")))] | length > 0' "$expect")
  [ "$(jq '[.patch // empty | @base64d | fromjson | .[]
      | select(.op != "remove" and ((.path == "/metadata/labels" and (.value | has("image-swapper.kubewarden.io/unmirrored")))
          or .path == "/metadata/labels/image-swapper.kubewarden.io~1unmirrored"))] | length > 0' <<<"$output")" == "$labelled" ]

  local message
  # The whole list of warnings, each to the letter (an extra warning fails), and each one line
  # for a person: no newline, no backtrace, whatever the host appended. None expected, none
  # given: a lookup the recording does not hold would have answered "Replay error: unexpected
  # request" and surfaced here.
  echo "warnings: want $(jq -c '.warnings // []' "$expect")"
  echo "warnings: got  $(jq -c '.warnings // []' <<<"$output")"
  jq -e --argjson w "$(jq -c '.warnings // []' "$expect")" '(.warnings // []) == $w' <<<"$output"
  jq -e '[.warnings[]? | test("\n|Stack backtrace|Caused by")] | any | not' <<<"$output"
  message=$(jq -r '.message // empty' "$expect")
  if [[ -n $message ]]; then
    jq -e --arg m "$message" '.status.message | contains($m)' <<<"$output"
    jq -e '.status.message | test("\n|Stack backtrace|Caused by") | not' <<<"$output"
  fi
  local code
  code=$(jq -r '.code // empty' "$expect")
  if [[ -n $code ]]; then
    # Kubewarden's audit scanner reports a rejection with code 500 as `error`, others as `fail`.
    [ "$(jq -r '.status.code' <<<"$output")" == "$code" ]
  elif [[ $(jq -r .allowed "$expect") == false ]]; then
    [ "$(jq -r '.status.code // empty' <<<"$output")" != 500 ]
  fi
  # Audit annotations: the same keys, each value the JSON expected; of an object (the summary),
  # the fields expected, so that the times it carries may differ.
  jq -e --argjson want "$(jq -c '.auditAnnotations // {}' "$expect")" '
    (.auditAnnotations // {} | map_values(fromjson)) as $got
    | ($got | keys) == ($want | keys)
      and all($want | to_entries[];
        .key as $k | .value as $v | $got[$k] as $g
        | if ($v | type) == "object"
          then ($g | type) == "object" and ($g | with_entries(select(.key as $f | $v | has($f)))) == $v
          else $g == $v end)' <<<"$output"
}
