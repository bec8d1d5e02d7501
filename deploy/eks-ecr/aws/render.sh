#!/usr/bin/env bash
# The IAM documents of an EKS overlay, from the one value it names: its mirror
# (ACCOUNT.dkr.ecr.REGION.amazonaws.com/PREFIX, the `mirror=` of its kustomization.yaml), and the
# cluster's OIDC provider id for the IRSA trust policies (the last part of `aws eks
# describe-cluster --query cluster.identity.oidc.issuer`). Writes into OUT (default: this
# folder) the two roles' trust policies and, for deploy/eks-ecr, fill-job.json and
# policy-server-reader.json; for a pull-through overlay (a rule marked pullThrough),
# pull-through-cache.json, both roles' policy. The files beside this script are its output for
# the overlays' example values (tests/docs.rs holds them to it).
#   usage: deploy/eks-ecr/aws/render.sh OVERLAY OIDC_ID [OUT]
set -euo pipefail
(($# == 2 || $# == 3)) || { echo "usage: $0 OVERLAY OIDC_ID [OUT]" >&2; exit 2; }
overlay=$1 oidc=$2 out=${3:-$(dirname "$0")}
mirror=$(sed -n 's/^ *- mirror=\([^ ]*\).*/\1/p' "$overlay/kustomization.yaml")
pattern='^([0-9]{12})\.dkr\.ecr\.([a-z0-9-]+)\.amazonaws\.com/([a-z0-9._-]+)$'
[[ $mirror =~ $pattern ]] || {
  echo "$overlay/kustomization.yaml: mirror=$mirror is not ACCOUNT.dkr.ecr.REGION.amazonaws.com/PREFIX" >&2
  exit 2
}
account=${BASH_REMATCH[1]} region=${BASH_REMATCH[2]} prefix=${BASH_REMATCH[3]}
[[ $oidc =~ ^[A-Za-z0-9]+$ ]] || { echo "OIDC_ID $oidc: the id at the end of the cluster's issuer URL" >&2; exit 2; }
mkdir -p "$out"
render() { jq -n --arg account "$account" --arg region "$region" --arg prefix "$prefix" \
  --arg issuer "oidc.eks.$region.amazonaws.com/id/$oidc" "$1" > "$out/$2"; }
repositories='"arn:aws:ecr:\($region):\($account):repository/\($prefix)/*"'
token='{Sid: "TokenForTheLookups", Effect: "Allow", Action: "ecr:GetAuthorizationToken", Resource: "*"}'
for account_name in mirror-credentials fill-mirror; do
  render "{Version: \"2012-10-17\", Statement: [{Effect: \"Allow\",
    Principal: {Federated: \"arn:aws:iam::\(\$account):oidc-provider/\(\$issuer)\"},
    Action: \"sts:AssumeRoleWithWebIdentity\",
    Condition: {StringEquals: {\"\(\$issuer):sub\": \"system:serviceaccount:kubewarden:$account_name\",
      \"\(\$issuer):aud\": \"sts.amazonaws.com\"}}}]}" "irsa-trust-$account_name.json"
done
if grep -q pullThrough "$overlay/settings.yaml"; then
  render "{Version: \"2012-10-17\", Statement: [$token, {Sid: \"LookUpAndFillTheCache\", Effect: \"Allow\",
    Action: [\"ecr:BatchGetImage\", \"ecr:GetDownloadUrlForLayer\", \"ecr:BatchImportUpstreamImage\", \"ecr:CreateRepository\"],
    Resource: $repositories}]}" pull-through-cache.json
  exit 0
fi
render "{Version: \"2012-10-17\", Statement: [$token, {Sid: \"ManifestsAndSignaturesOfTheMirror\", Effect: \"Allow\",
  Action: [\"ecr:BatchGetImage\", \"ecr:GetDownloadUrlForLayer\"], Resource: $repositories}]}" policy-server-reader.json
render "{Version: \"2012-10-17\", Statement: [{Sid: \"PushLogin\", Effect: \"Allow\", Action: \"ecr:GetAuthorizationToken\", Resource: \"*\"},
  {Sid: \"CreateInspectAndPushUnderTheMirror\", Effect: \"Allow\", Action: [\"ecr:CreateRepository\", \"ecr:BatchGetImage\",
    \"ecr:GetDownloadUrlForLayer\", \"ecr:BatchCheckLayerAvailability\", \"ecr:InitiateLayerUpload\", \"ecr:UploadLayerPart\",
    \"ecr:CompleteLayerUpload\", \"ecr:PutImage\"], Resource: $repositories},
  {Sid: \"LifecycleOfTheRepositoriesTheJobCreated\", Effect: \"Allow\",
    Action: [\"ecr:GetLifecyclePolicy\", \"ecr:PutLifecyclePolicy\"], Resource: $repositories},
  {Sid: \"ListTheRepositories\", Effect: \"Allow\", Action: \"ecr:DescribeRepositories\",
    Resource: \"arn:aws:ecr:\(\$region):\(\$account):repository/*\"}]}" fill-job.json
