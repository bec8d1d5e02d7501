//! The in-use set: what one cluster's workloads use of a mirror registry, the one record the
//! retention reads. Each cluster's fill controller publishes its set into the mirror itself (an
//! OCI artifact tagged with the cluster's id) and anchors every digest it uses with a tag of its
//! own (`inuse-<cluster>-<hex>`), so that many clusters share one mirror with no database beside
//! it: the prune reads every cluster's set, and the registries' own retention rules (ECR, Artifact
//! Registry, Harbor) keep what an anchor tag names. docs/retention.md says why this shape.

use k8s_openapi::jiff::Timestamp;
use serde::{Deserialize, Serialize};

/// The artifact's `artifactType`, and its one layer's media type.
pub const MEDIA_TYPE: &str = "application/vnd.kubewarden.image-swapper.in-use.v1+json";
/// The repository a set is published in, under each mirror registry (its tag is the cluster id).
pub const DEFAULT_REPOSITORY: &str = "image-swapper/in-use";
/// Every anchor tag starts so: the registries' keep rules select this prefix.
pub const ANCHOR_PREFIX: &str = "inuse-";
/// A cluster id is a tag of its own and part of every anchor tag: `inuse-` (6), the id, `-` and
/// 64 hex digits stay within a tag's 128 characters at 57; 40 leaves room and reads as a name.
pub const CLUSTER_ID_MAX: usize = 40;

/// One cluster's set, as published: the artifact's layer, JSON.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct InUseSet {
    /// The publishing cluster's id (`--cluster-id`), also the artifact's tag.
    pub cluster: String,
    /// When this set was published: a set older than the prune's `--stale-after` blocks every
    /// deletion, since the cluster may use what it no longer says.
    pub published: Timestamp,
    /// How often the cluster publishes, in seconds: what a reader expects between two sets.
    pub period_seconds: u64,
    /// Every digest the cluster used within the retention's age, one entry per repository and
    /// digest, sorted by repository then digest.
    pub images: Vec<InUseImage>,
}

/// One digest of one mirror repository a cluster uses, or used within the age.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct InUseImage {
    /// The repository in the mirror registry, without the host (`cache/docker.io/library/nginx`).
    pub repository: String,
    /// `sha256:<64 hex>`.
    pub digest: String,
    /// The last time a Pod, a template or a rollback ReplicaSet named it.
    pub last_seen: Timestamp,
    /// What named it at `last_seen` (`Deployment shop/web`, `Pod shop/web-7d9f-x2x`,
    /// `ReplicaSet shop/web-5c4b (revision 3)`): the dry run's and the metrics' why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub used_by: Vec<String>,
}

/// A cluster id that is not usable as a tag and inside an anchor tag: names the value.
pub fn check_cluster_id(id: &str) -> Result<(), String> {
    let well_formed = !id.is_empty()
        && id.len() <= CLUSTER_ID_MAX
        && id
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !id.starts_with('-')
        && !id.ends_with('-');
    if well_formed {
        Ok(())
    } else {
        Err(format!(
            "--cluster-id {id:?}: must be 1 to {CLUSTER_ID_MAX} of a-z, 0-9 and '-', \
             neither first nor last a '-' (it is a tag, and part of every anchor tag)"
        ))
    }
}

/// The tag that anchors `digest` for `cluster` in its repository: `inuse-<cluster>-<hex>`.
/// None for a digest that is not `sha256:` and 64 lowercase hex digits.
pub fn anchor_tag(cluster: &str, digest: &str) -> Option<String> {
    let hex = digest.strip_prefix("sha256:")?;
    let is_hex = hex.len() == 64
        && hex
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    is_hex.then(|| format!("{ANCHOR_PREFIX}{cluster}-{hex}"))
}

/// The cluster and digest an anchor tag names; None for any other tag. Cluster ids may hold '-',
/// so the digest is the last 64 characters.
// Read by the prune, which the watch does not run.
#[allow(dead_code)]
pub fn parse_anchor_tag(tag: &str) -> Option<(&str, String)> {
    let rest = tag.strip_prefix(ANCHOR_PREFIX)?;
    let split = rest.len().checked_sub(65)?;
    let (cluster, dash_hex) = rest.split_at(split);
    let hex = dash_hex.strip_prefix('-')?;
    let digest = format!("sha256:{hex}");
    (check_cluster_id(cluster).is_ok() && anchor_tag(cluster, &digest).as_deref() == Some(tag))
        .then_some((cluster, digest))
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEX: &str = "92fa270a8071da49ccdad2b13d1a7db83ae7749a89946990b1cf6c9b09131374";

    #[test]
    fn an_anchor_tag_names_the_cluster_and_the_digest_and_reads_back() {
        let digest = format!("sha256:{HEX}");
        let tag = anchor_tag("prod-eu-1", &digest).unwrap();
        assert_eq!(tag, format!("inuse-prod-eu-1-{HEX}"));
        assert!(tag.len() <= 128);
        assert_eq!(parse_anchor_tag(&tag), Some(("prod-eu-1", digest)));
    }

    #[test]
    fn the_longest_cluster_id_still_makes_a_tag_of_at_most_128_characters() {
        let id = "a".repeat(CLUSTER_ID_MAX);
        assert!(check_cluster_id(&id).is_ok());
        let tag = anchor_tag(&id, &format!("sha256:{HEX}")).unwrap();
        assert!(tag.len() <= 128, "{} characters", tag.len());
        assert!(check_cluster_id(&"a".repeat(CLUSTER_ID_MAX + 1)).is_err());
    }

    #[test]
    fn other_tags_and_malformed_digests_are_not_anchors() {
        for tag in [
            "1.27",
            "inuse-",
            "inuse-prod",
            &format!("inuse-{HEX}"),
            &format!("inuse-Prod-{HEX}"),
            &format!("inuse--{HEX}"),
            &format!("inuse-prod-{}", &HEX[1..]),
            &format!("inuse-prod-{}", HEX.to_uppercase()),
            &format!("sha256-{HEX}.sig"),
        ] {
            assert_eq!(parse_anchor_tag(tag), None, "{tag}");
        }
        assert_eq!(anchor_tag("prod", "sha512:abc"), None);
        assert_eq!(anchor_tag("prod", &format!("sha256:{}", &HEX[2..])), None);
    }

    #[test]
    fn cluster_ids_that_are_not_tags_are_refused_naming_the_value() {
        for id in ["", "Prod", "prod_eu", "-prod", "prod-", "prod.eu", "pröd"] {
            let err = check_cluster_id(id).unwrap_err();
            assert!(err.contains(&format!("{id:?}")), "{err}");
        }
    }

    #[test]
    fn a_hand_written_set_reads_and_an_unknown_field_is_refused() {
        let text = r#"{"cluster":"prod","published":"2026-12-05T02:50:00Z","periodSeconds":600,
          "images":[{"repository":"cache/docker.io/library/nginx",
                     "digest":"sha256:92fa270a8071da49ccdad2b13d1a7db83ae7749a89946990b1cf6c9b09131374",
                     "lastSeen":"2026-12-01T00:00:00Z","usedBy":["Deployment shop/web"]}]}"#;
        let set: InUseSet = serde_json::from_str(text).unwrap();
        assert_eq!(set.images[0].last_seen.to_string(), "2026-12-01T00:00:00Z");
        assert_eq!(set.images[0].used_by, ["Deployment shop/web"]);
        let extra = text.replacen("\"cluster\"", "\"clusters\":1,\"cluster\"", 1);
        assert!(serde_json::from_str::<InUseSet>(&extra).is_err());
    }
}
