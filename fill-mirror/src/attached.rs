//! What travels with an image: for every digest a copy brought or found (an index and each
//! manifest it lists), the source's cosign tags (`sha256-<hex>.sig`, `.att`, `.sbom`) and its
//! OCI 1.1 referrers, so that a verifier or a scanner at the mirror finds what it finds at the
//! source. Separate from the copy because its rules differ: a signature tag follows its
//! source (copied over when it differs: that is not moving an image tag), a referrer is copied
//! by digest, and nothing is carried for a digest the source's tag no longer names (issue #47:
//! the mirror's old digest must not gain the signatures that make it verify as current).
//! It runs inside the image's job, one request after another, so it counts in `--jobs`.

use image_swapper_policy::plan::Copy;
use image_swapper_policy::reference::Reference;

use crate::board::Outcome;
use crate::digest::digest_of;
use crate::referrers::{Referrers, index_digests};
use crate::skopeo::Skopeo;

/// The tags cosign writes beside a digest: its signatures, attestations and SBOM.
pub const COSIGN_SUFFIXES: [&str; 3] = ["sig", "att", "sbom"];

/// One thing carried (or not) with an image: its destination and how it ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Carried {
    pub destination: String,
    pub outcome: Outcome,
}

/// `sha256:<hex>` -> `sha256-<hex>`: the tag schema's name for a digest, the base of cosign's
/// tags.
fn tag_of(digest: &str) -> String {
    digest.replacen(':', "-", 1)
}

/// The repository (`host/path`) a copy's reference names, and the reference's tag when it is
/// by tag (not pinned).
fn repository(reference: &str) -> Result<(String, Option<String>), String> {
    let parsed = Reference::parse(reference).map_err(|error| format!("{reference:?}: {error}"))?;
    let tag = match parsed.digest() {
        Some(_) => None,
        None => parsed.tag().map(str::to_string),
    };
    Ok((parsed.name().to_string(), tag))
}

/// The digests a manifest brings: its own, then each one an index lists.
fn digests(manifest: &[u8]) -> Vec<String> {
    let mut digests = vec![digest_of(manifest)];
    digests.extend(index_digests(manifest).unwrap_or_default());
    digests
}

/// After `copy` was made or found made: everything that travels with what the destination now
/// holds. When the source names the image by tag and that tag now names another digest than
/// the destination's, nothing is carried and the one entry says so (`Refused`).
pub async fn carry(engine: &Skopeo, referrers: &Referrers, copy: &Copy) -> Vec<Carried> {
    let failed = |destination: &str, words: String| {
        vec![Carried {
            destination: destination.to_string(),
            outcome: Outcome::Failed(words),
        }]
    };
    let ((source_repository, source_tag), (destination_repository, _)) =
        match (repository(&copy.source), repository(&copy.destination)) {
            (Ok(source), Ok(destination)) => (source, destination),
            (Err(words), _) | (_, Err(words)) => return failed(&copy.destination, words),
        };
    let mut held = match engine.manifest(&copy.destination).await {
        Ok(Some(manifest)) => manifest,
        Ok(None) => {
            return failed(
                &copy.destination,
                "the mirror does not hold it after the copy".to_string(),
            );
        }
        Err(words) => return failed(&copy.destination, words),
    };
    let held_digest = digest_of(&held);
    if source_tag.is_some() {
        match engine.manifest(&copy.source).await {
            Ok(Some(now)) if digest_of(&now) != held_digest => {
                // The source moved its tag: what is carried is for the digest it names now, when
                // the mirror holds it beside the tag (`Skopeo::moved_tag` copied it there).
                let now = digest_of(&now);
                match engine
                    .manifest(&format!("{destination_repository}@{now}"))
                    .await
                {
                    Ok(Some(beside)) if digest_of(&beside) == now => held = beside,
                    _ => {
                        return vec![Carried {
                            destination: copy.destination.clone(),
                            outcome: Outcome::Refused(format!(
                                "the mirror's {} is {held_digest} and the source's tag {} now names {now}: nothing signed for {held_digest} is copied",
                                copy.destination, copy.source,
                            )),
                        }];
                    }
                }
            }
            Ok(_) => {}
            Err(words) => return failed(&copy.source, words),
        }
    }
    let mut carried = Vec::new();
    for digest in digests(&held) {
        if !digest.starts_with("sha256:") {
            continue;
        }
        for suffix in COSIGN_SUFFIXES {
            let tag = format!("{}.{suffix}", tag_of(&digest));
            let source = format!("{source_repository}:{tag}");
            let destination = format!("{destination_repository}:{tag}");
            if let Some(outcome) = follow(engine, &source, &destination).await {
                carried.push(Carried {
                    destination,
                    outcome,
                });
            }
        }
        carried.extend(
            carry_referrers(
                engine,
                referrers,
                &source_repository,
                &destination_repository,
                &digest,
            )
            .await,
        );
    }
    carried
}

/// A tag that follows its source: copied when the source has it and the destination holds
/// anything else; `None` when the source has none.
pub async fn follow(engine: &Skopeo, source: &str, destination: &str) -> Option<Outcome> {
    let wanted = match engine.manifest(source).await {
        Ok(Some(manifest)) => digest_of(&manifest),
        Ok(None) => return None,
        Err(words) => return Some(Outcome::Failed(words)),
    };
    match engine.manifest(destination).await {
        Ok(Some(held)) if digest_of(&held) == wanted => Some(Outcome::Present),
        Ok(_) => Some(engine.copy_over(source, destination).await),
        Err(words) => Some(Outcome::Failed(words)),
    }
}

/// The referrers of `digest` at the source, each copied by digest unless the destination
/// holds it: from the referrers API, or, where the source does not serve it (404), from the
/// tag schema's index (`sha256-<hex>`), keeping only the manifests whose `subject` is
/// `digest` (at a source that is itself a mirror of this project that tag is an image). The
/// destination's `sha256-<hex>` tag is never written: in a mirror it is a pinned image's own
/// tag; a destination that serves the API lists the copies by their `subject`.
async fn carry_referrers(
    engine: &Skopeo,
    referrers: &Referrers,
    source_repository: &str,
    destination_repository: &str,
    digest: &str,
) -> Vec<Carried> {
    let listed = match referrers.list(source_repository, digest).await {
        Ok(Some(listed)) => listed,
        Ok(None) => match tag_schema(engine, source_repository, digest).await {
            Ok(listed) => listed,
            Err(words) => {
                return vec![Carried {
                    destination: format!("{destination_repository}@{digest}"),
                    outcome: Outcome::Failed(format!("its referrers not read: {words}")),
                }];
            }
        },
        Err(words) => {
            return vec![Carried {
                destination: format!("{destination_repository}@{digest}"),
                outcome: Outcome::Failed(format!("its referrers not read: {words}")),
            }];
        }
    };
    let mut carried = Vec::new();
    for referrer in listed {
        let source = format!("{source_repository}@{referrer}");
        let destination = format!("{destination_repository}@{referrer}");
        let outcome = match engine.manifest(&destination).await {
            Ok(Some(_)) => Outcome::Present,
            Ok(None) => engine.copy_over(&source, &destination).await,
            Err(words) => Outcome::Failed(words),
        };
        carried.push(Carried {
            destination,
            outcome,
        });
    }
    carried
}

/// The referrers the tag schema's index lists for `digest`: those whose manifest names it as
/// `subject`.
async fn tag_schema(
    engine: &Skopeo,
    repository: &str,
    digest: &str,
) -> Result<Vec<String>, String> {
    let Some(index) = engine
        .manifest(&format!("{repository}:{}", tag_of(digest)))
        .await?
    else {
        return Ok(Vec::new());
    };
    let mut listed = Vec::new();
    for candidate in index_digests(&index).unwrap_or_default() {
        let Some(manifest) = engine
            .manifest(&format!("{repository}@{candidate}"))
            .await?
        else {
            continue;
        };
        let subject = serde_json::from_slice::<serde_json::Value>(&manifest)
            .ok()
            .and_then(|m| m.pointer("/subject/digest")?.as_str().map(str::to_string));
        if subject.as_deref() == Some(digest) {
            listed.push(candidate);
        }
    }
    Ok(listed)
}

/// The copy of a signature a record names (`…:sha256-<hex>.sig`), as a tag that follows its
/// source; refused when the image it signs is named by a tag that now names another digest
/// (the record was written for the old one).
pub async fn copy_signature(engine: &Skopeo, copy: &Copy, signs: &str) -> Outcome {
    let signed = copy
        .source
        .rsplit_once(':')
        .and_then(|(_, tag)| tag.strip_suffix(".sig"))
        .map(|tag| tag.replacen('-', ":", 1));
    let Some(signed) = signed else {
        return Outcome::Failed(format!("{} is not a cosign signature tag", copy.source));
    };
    if matches!(repository(signs), Ok((_, Some(_)))) {
        match engine.manifest(signs).await {
            Ok(Some(now)) if digest_of(&now) != signed => {
                return Outcome::Refused(format!(
                    "the record names the signature of {signed}, and the source's tag {signs} now names {}: not copied",
                    digest_of(&now)
                ));
            }
            Ok(Some(_)) => {}
            Ok(None) => return Outcome::Gone(format!("the source has no {signs}")),
            Err(words) => return Outcome::Failed(words),
        }
    }
    match follow(engine, &copy.source, &copy.destination).await {
        Some(outcome) => outcome,
        None => Outcome::Gone(format!("the source has no {}", copy.source)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_index_brings_its_own_digest_and_each_it_lists() {
        let index =
            br#"{"schemaVersion":2,"manifests":[{"digest":"sha256:aa"},{"digest":"sha256:bb"}]}"#;
        assert_eq!(
            digests(index),
            [digest_of(index), "sha256:aa".into(), "sha256:bb".into()]
        );
        assert_eq!(
            repository("127.0.0.1:5000/app/web:1"),
            Ok(("127.0.0.1:5000/app/web".to_string(), Some("1".to_string())))
        );
    }
}
