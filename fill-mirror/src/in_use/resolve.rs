//! The named images as the mirror holds them: each tag looked up, each digest read (an index
//! brings its platforms' manifests), and with each the artifacts attached to it (the cosign
//! tags `sha256-<hex>.sig|.att|.sbom`, and the referrers whose subject it is, where the
//! registry serves the referrers API): a kept image whose signature was pruned is swapped no
//! more. What the mirror does not hold is not in use of it.

use std::collections::{BTreeMap, BTreeSet};

use futures::StreamExt;
use image_swapper_policy::policy::Policy;

use crate::mirror_api::{Manifest, Mirror, split_host};
use crate::referrers::{Referrers, index_digests};

use super::merge::Seen;
use super::named::{InMirror, Named, Pin, in_mirror};

/// Requests to the mirror at once: a pass over many images takes a fraction of a period, and
/// the registry is not flooded.
pub const AT_ONCE: usize = 8;

/// The tags cosign attaches to `sha256:<hex>` as `sha256-<hex>.<suffix>`.
const ATTACHED: [&str; 3] = ["sig", "att", "sbom"];

/// What one pass found in the mirror: per registry host, the digests in use; every manifest
/// read, by `host/path@digest`, for the anchors; the lookups that failed.
#[derive(Default)]
pub struct Found {
    pub seen: BTreeMap<String, Vec<Seen>>,
    pub manifests: BTreeMap<String, Manifest>,
    pub failures: Vec<String>,
}

/// Looks every named image up in the mirror.
pub async fn resolve(
    mirror: &Mirror,
    referrers: &Referrers,
    named: &[Named],
    policy: &Policy,
) -> Found {
    let mut wanted: BTreeMap<InMirror, BTreeSet<String>> = BTreeMap::new();
    for one in named {
        for place in in_mirror(&one.image, policy) {
            wanted.entry(place).or_default().insert(one.used_by.clone());
        }
    }
    // (repository, digest) -> what names it.
    let mut digests: BTreeMap<(String, String), BTreeSet<String>> = BTreeMap::new();
    let mut found = Found::default();
    let answers: Vec<_> = futures::stream::iter(wanted)
        .map(|(place, used_by)| async move {
            let reference = match &place.pin {
                Pin::Digest(digest) => digest.clone(),
                Pin::Tag(tag) => tag.clone(),
            };
            let answer = mirror.manifest(&place.repository, &reference).await;
            (place, used_by, answer)
        })
        .buffer_unordered(AT_ONCE)
        .collect()
        .await;
    for (place, used_by, answer) in answers {
        match answer {
            Ok(Some(manifest)) => {
                let at = (place.repository.clone(), manifest.digest.clone());
                for child in index_digests(&manifest.bytes).unwrap_or_default() {
                    let of = used_by
                        .iter()
                        .map(|u| format!("{u} (in index {})", manifest.digest));
                    digests
                        .entry((place.repository.clone(), child))
                        .or_default()
                        .extend(of);
                }
                found
                    .manifests
                    .insert(format!("{}@{}", at.0, at.1), manifest);
                digests.entry(at).or_default().extend(used_by);
            }
            Ok(None) => {}
            Err(error) => {
                // A digest named outright is in use whether or not the mirror answers now.
                if let Pin::Digest(digest) = &place.pin {
                    digests
                        .entry((place.repository.clone(), digest.clone()))
                        .or_default()
                        .extend(used_by);
                }
                found.failures.push(error);
            }
        }
    }
    let mut attached: BTreeMap<(String, String), BTreeSet<String>> = BTreeMap::new();
    let keys: Vec<(String, String)> = digests.keys().cloned().collect();
    let lists: Vec<_> = futures::stream::iter(keys)
        .map(|(repository, digest)| async move {
            let (list, failures) = attached_to(mirror, referrers, &repository, &digest).await;
            (repository, digest, list, failures)
        })
        .buffer_unordered(AT_ONCE)
        .collect()
        .await;
    for (repository, digest, list, failures) in lists {
        found.failures.extend(failures);
        for (artifact, manifest) in list {
            attached
                .entry((repository.clone(), artifact.clone()))
                .or_default()
                .insert(format!("attached to {digest}"));
            if let Some(manifest) = manifest {
                found
                    .manifests
                    .insert(format!("{repository}@{artifact}"), manifest);
            }
        }
    }
    for (at, used_by) in attached {
        digests.entry(at).or_default().extend(used_by);
    }
    for ((repository, digest), used_by) in digests {
        let (host, path) = split_host(&repository);
        found.seen.entry(host.to_string()).or_default().push(Seen {
            repository: path.to_string(),
            digest,
            used_by: used_by.into_iter().collect(),
        });
    }
    found
}

/// The artifacts attached to `digest` in `repository`: the cosign tags' manifests, and the
/// referrers (their manifests read later, for the anchors, when not read here).
async fn attached_to(
    mirror: &Mirror,
    referrers: &Referrers,
    repository: &str,
    digest: &str,
) -> (Vec<(String, Option<Manifest>)>, Vec<String>) {
    let (mut attached, mut failures) = (Vec::new(), Vec::new());
    let Some(hex) = digest.strip_prefix("sha256:") else {
        return (attached, failures);
    };
    for suffix in ATTACHED {
        match mirror
            .manifest(repository, &format!("sha256-{hex}.{suffix}"))
            .await
        {
            Ok(Some(manifest)) => attached.push((manifest.digest.clone(), Some(manifest))),
            Ok(None) => {}
            Err(error) => failures.push(error),
        }
    }
    match referrers.list(repository, digest).await {
        Ok(listed) => attached.extend(listed.into_iter().flatten().map(|d| (d, None))),
        Err(error) => failures.push(error),
    }
    (attached, failures)
}
