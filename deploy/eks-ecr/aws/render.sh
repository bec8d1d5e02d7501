#!/usr/bin/env bash
# The IAM documents of an EKS overlay, from the values of its kustomization.yaml: its mirror
# (`mirror=`: ACCOUNT.dkr.ecr.REGION.amazonaws.com/PREFIX, or ACCOUNT.dkr.ecr.REGION.amazonaws.com
# alone for k8s-image-swapper's default layout, each source host the first path component of its
# repositories: docker.io/library/nginx) and, for a mirror at the registry's root only,
# `sourceHosts=` (the source registries it holds, comma-separated); and the cluster's OIDC
# provider id for the IRSA trust policies (the last part of `aws eks describe-cluster --query
# cluster.identity.oidc.issuer`). Writes into OUT (default: this folder) the two roles' trust
# policies and, for deploy/eks-ecr, fill-job.json, policy-server-reader.json and prune-job.json
# with its trust policy (the prune's, ServiceAccount mirror-unanchor: the one identity that may
# delete, an anchor tag, docs/retention.md), and the
# lifecycle CronJob's role (without-creation-template): its trust policy and lifecycle-job.json; for a
# pull-through overlay (a rule marked pullThrough), pull-through-cache.json, both roles' policy.
# The files beside this script are its output for the overlays' example values (tests/docs.rs
# holds them to it). Needs bash and jq.
# The repositories the roles may use are the mirror's and no others: under a prefix,
# `repository/PREFIX/*`; at the registry's root, `repository/HOST/*` for each of `sourceHosts`.
# Not `repository/*` (k8s-image-swapper's documented example): that lets the fill controller
# push over every repository of the account, the mirror's or not; nor `repository/*.*/*`, which
# is no narrower (an ARN's `*` spans `/`). An image of a host not listed is still routed by
# defaultMirror: its lookups are refused (the Pod keeps its source image, with onLookupError's
# warning) and its copies fail (fill-mirror's failed count); add the host and render again.
#   usage: deploy/eks-ecr/aws/render.sh OVERLAY OIDC_ID [OUT]
set -euo pipefail
(($# == 2 || $# == 3)) || { echo "usage: $0 OVERLAY OIDC_ID [OUT]" >&2; exit 2; }
overlay=$1 oidc=$2 out=${3:-$(dirname "$0")}
value() { sed -n "s/^ *- $1=\([^ ]*\).*/\1/p" "$overlay/kustomization.yaml"; }
mirror=$(value mirror)
pattern='^([0-9]{12})\.dkr\.ecr\.([a-z0-9-]+)\.amazonaws\.com(/([a-z0-9._-]+))?$'
[[ $mirror =~ $pattern ]] || {
  echo "$overlay/kustomization.yaml: mirror=$mirror is not ACCOUNT.dkr.ecr.REGION.amazonaws.com[/PREFIX]" >&2
  exit 2
}
account=${BASH_REMATCH[1]} region=${BASH_REMATCH[2]} prefixes=${BASH_REMATCH[4]}
pull_through=$(grep -c pullThrough "$overlay/settings.yaml" || true)
if [[ -z $prefixes ]]; then
  ((pull_through == 0)) || { echo "$overlay: a pull-through cache's mirror is ACCOUNT.dkr.ecr.REGION.amazonaws.com/PREFIX, its rule's prefix" >&2; exit 2; }
  # An ECR repository name's first component that is a registry host: no port, lower case.
  host='[a-z0-9]+([._-][a-z0-9]+)*\.[a-z0-9]+([._-][a-z0-9]+)*'
  [[ $(value sourceHosts) =~ ^$host(,$host)*$ ]] || {
    echo "$overlay/kustomization.yaml: a mirror at the registry's root needs sourceHosts=HOST[,HOST...] (registry hosts, no port): got '$(value sourceHosts)'" >&2
    exit 2
  }
  prefixes=$(value sourceHosts)
fi
[[ $oidc =~ ^[A-Za-z0-9]+$ ]] || { echo "OIDC_ID $oidc: the id at the end of the cluster's issuer URL" >&2; exit 2; }
mkdir -p "$out"
render() { jq -n --arg account "$account" --arg region "$region" --arg prefixes "$prefixes" \
  --arg issuer "oidc.eks.$region.amazonaws.com/id/$oidc" "$1" > "$out/$2"; }
# One ARN (a string) for one prefix, a list for several.
repositories='($prefixes | split(",") | map("arn:aws:ecr:\($region):\($account):repository/\(.)/*")
  | if length == 1 then .[0] else . end)'
token='{Sid: "TokenForTheLookups", Effect: "Allow", Action: "ecr:GetAuthorizationToken", Resource: "*"}'
# The IRSA trust policy of the role of ServiceAccount kubewarden/$1.
trust() {
  render "{Version: \"2012-10-17\", Statement: [{Effect: \"Allow\",
    Principal: {Federated: \"arn:aws:iam::\(\$account):oidc-provider/\(\$issuer)\"},
    Action: \"sts:AssumeRoleWithWebIdentity\",
    Condition: {StringEquals: {\"\(\$issuer):sub\": \"system:serviceaccount:kubewarden:$1\",
      \"\(\$issuer):aud\": \"sts.amazonaws.com\"}}}]}" "irsa-trust-$1.json"
}
for account_name in mirror-credentials fill-mirror; do trust "$account_name"; done
if ((pull_through > 0)); then
  render "{Version: \"2012-10-17\", Statement: [$token, {Sid: \"LookUpAndFillTheCache\", Effect: \"Allow\",
    Action: [\"ecr:BatchGetImage\", \"ecr:GetDownloadUrlForLayer\", \"ecr:BatchImportUpstreamImage\", \"ecr:CreateRepository\"],
    Resource: $repositories}]}" pull-through-cache.json
  exit 0
fi
render "{Version: \"2012-10-17\", Statement: [$token, {Sid: \"ManifestsAndSignaturesOfTheMirror\", Effect: \"Allow\",
  Action: [\"ecr:BatchGetImage\", \"ecr:GetDownloadUrlForLayer\"], Resource: $repositories}]}" policy-server-reader.json
# The in-use set's repository (docs/retention.md): the watch publishes its set there, the prune
# reads every cluster's and keeps its ledger there.
in_use="arn:aws:ecr:$region:$account:repository/image-swapper/in-use"
render "{Version: \"2012-10-17\", Statement: [{Sid: \"PushLogin\", Effect: \"Allow\", Action: \"ecr:GetAuthorizationToken\", Resource: \"*\"},
  {Sid: \"CreateInspectAndPushUnderTheMirror\", Effect: \"Allow\", Action: [\"ecr:CreateRepository\", \"ecr:BatchGetImage\",
    \"ecr:GetDownloadUrlForLayer\", \"ecr:BatchCheckLayerAvailability\", \"ecr:InitiateLayerUpload\", \"ecr:UploadLayerPart\",
    \"ecr:CompleteLayerUpload\", \"ecr:PutImage\"], Resource: $repositories},
  {Sid: \"PublishTheInUseSet\", Effect: \"Allow\", Action: [\"ecr:BatchGetImage\", \"ecr:GetDownloadUrlForLayer\",
    \"ecr:BatchCheckLayerAvailability\", \"ecr:InitiateLayerUpload\", \"ecr:UploadLayerPart\",
    \"ecr:CompleteLayerUpload\", \"ecr:PutImage\"], Resource: \"$in_use\"},
  {Sid: \"ListTheRepositories\", Effect: \"Allow\", Action: \"ecr:DescribeRepositories\",
    Resource: \"arn:aws:ecr:\(\$region):\(\$account):repository/*\"}]}" fill-job.json
# The prune: every cluster's in-use set read from the in-use repository, where it keeps its
# ledger (a push); the mirror's images listed and their manifests read; a stale anchor tag removed
# (BatchDeleteImage by tag removes that tag only while the image has others: the last one goes
# with its image, which the lifecycle rule would expire anyway). No other identity may delete.
# Its role is the unanchoring CronJob's (mirror-unanchor.yaml).
trust mirror-unanchor
render "{Version: \"2012-10-17\", Statement: [{Sid: \"PullLogin\", Effect: \"Allow\", Action: \"ecr:GetAuthorizationToken\", Resource: \"*\"},
  {Sid: \"ReadTheInUseSetsAndKeepTheLedger\", Effect: \"Allow\", Action: [\"ecr:ListImages\", \"ecr:BatchGetImage\",
    \"ecr:GetDownloadUrlForLayer\", \"ecr:BatchCheckLayerAvailability\", \"ecr:InitiateLayerUpload\", \"ecr:UploadLayerPart\",
    \"ecr:CompleteLayerUpload\", \"ecr:PutImage\"], Resource: \"$in_use\"},
  {Sid: \"InventoryAndUnanchorTheMirror\", Effect: \"Allow\", Action: [\"ecr:DescribeImages\", \"ecr:BatchGetImage\",
    \"ecr:BatchDeleteImage\"], Resource: $repositories},
  {Sid: \"ListTheRepositories\", Effect: \"Allow\", Action: \"ecr:DescribeRepositories\",
    Resource: \"arn:aws:ecr:\(\$region):\(\$account):repository/*\"}]}" prune-job.json
# The lifecycle CronJob of without-creation-template, a role of its own: setting a lifecycle
# policy can expire the whole mirror, which the copying identity has no need to.
trust mirror-lifecycle
render "{Version: \"2012-10-17\", Statement: [{Sid: \"LifecycleOfTheRepositoriesTheFillControllerCreated\", Effect: \"Allow\",
    Action: [\"ecr:GetLifecyclePolicy\", \"ecr:PutLifecyclePolicy\"], Resource: $repositories},
  {Sid: \"ListTheRepositories\", Effect: \"Allow\", Action: \"ecr:DescribeRepositories\",
    Resource: \"arn:aws:ecr:\(\$region):\(\$account):repository/*\"}]}" lifecycle-job.json
