# Runs one case of e2e/cases/ under real `kwctl run`, with the case's recorded host
# interactions, and checks the answer against the case's expect.json. tests/e2e_recordings.rs
# replays the same files in the project's own wasm host, so both runners hold the same contract.
bats_require_minimum_version 1.5.0

POLICY=${POLICY:-annotated-policy.wasm}

check_case() {
  local dir="e2e/cases/$1"
  local expect="$dir/expect.json"
  run --separate-stderr kwctl run \
    --request-path "$dir/request.json" \
    --settings-path "$dir/settings.yml" \
    --replay-host-capabilities-interactions "$dir/session.yml" \
    "$POLICY"

  if [[ $(jq -r '.settingsValid // true' "$expect") == false ]]; then
    [ "$status" -ne 0 ]
    [[ "$output $stderr" == *"Provided settings are not valid"* ]]
    [[ "$output $stderr" == *"$(jq -r .message "$expect")"* ]]
    return 0
  fi

  [ "$status" -eq 0 ]
  [ "$(jq -r .allowed <<<"$output")" == "$(jq -r .allowed "$expect")" ]

  if [[ $(jq -r '.patch == null' "$expect") == true ]]; then
    # No patch at all: nothing changes when the policy has nothing to change.
    ! jq -er .patch <<<"$output"
  else
    local path
    for path in $(jq -r '.patch | keys[]' "$expect"); do
      local want got
      want=$(jq -r --arg p "$path" '.patch[$p]' "$expect")
      got=$(jq -r --arg p "$path" '.patch | @base64d | fromjson | map(select(.path == $p)) | .[0].value' <<<"$output")
      [ "$got" == "$want" ]
    done
  fi

  local warning message
  warning=$(jq -r '.warning // empty' "$expect")
  if [[ -n $warning ]]; then
    jq -e --arg w "$warning" '[.warnings[]? | contains($w)] | any' <<<"$output"
  fi
  message=$(jq -r '.message // empty' "$expect")
  if [[ -n $message ]]; then
    jq -e --arg m "$message" '.status.message | contains($m)' <<<"$output"
  fi
}
