//! The mirror's inventory, read from the registry: every repository under the pruned prefixes
//! (the catalog), each tag's digest, and the referrers of each digest where the registry serves
//! the referrers API. Untagged manifests a registry lists nowhere are not in it, and so never
//! deleted by the prune (a registry's garbage collection is the one that sees them).

use std::collections::BTreeMap;

use futures::{StreamExt, TryStreamExt};

use crate::mirror_api::Mirror;
use crate::referrers::Referrers;
use crate::retention::plan::{Manifest, Repository};

/// Requests in flight at once while resolving tags.
const AT_ONCE: usize = 8;

/// Whether `repository` lies under one of `paths` (a path prefix as a whole segment; an empty
/// path is the whole registry) and is not the in-use repository.
pub fn pruned(repository: &str, paths: &[String], in_use_repository: &str) -> bool {
    repository != in_use_repository
        && paths.iter().any(|path| {
            path.is_empty()
                || repository == path
                || repository
                    .strip_prefix(path.as_str())
                    .is_some_and(|rest| rest.starts_with('/'))
        })
}

/// Every manifest of every repository of the registry `host` under `paths`, with its tags
/// and subject.
pub async fn inventory(
    mirror: &Mirror,
    referrers: &Referrers,
    host: &str,
    paths: &[String],
    in_use_repository: &str,
) -> Result<Vec<Repository>, String> {
    let mut repositories = Vec::new();
    // Once a registry answers that it serves no referrers API, it is not asked again.
    let mut serves_referrers = true;
    for name in mirror.catalog(host).await? {
        if !pruned(&name, paths, in_use_repository) {
            continue;
        }
        let full = format!("{host}/{name}");
        let tags = mirror.tags(&full).await?;
        let resolved: Vec<(String, Option<String>)> = futures::stream::iter(tags)
            .map(|tag| async {
                let digest = mirror.resolve(&full, &tag).await?;
                Ok::<_, String>((tag, digest))
            })
            .buffered(AT_ONCE)
            .try_collect()
            .await?;
        let mut by_digest: BTreeMap<String, Manifest> = BTreeMap::new();
        for (tag, digest) in resolved {
            // A tag deleted between the list and its lookup names nothing any more.
            let Some(digest) = digest else { continue };
            by_digest
                .entry(digest.clone())
                .or_insert_with(|| Manifest {
                    digest,
                    tags: Vec::new(),
                    subject: None,
                })
                .tags
                .push(tag);
        }
        if serves_referrers {
            let subjects: Vec<String> = by_digest.keys().cloned().collect();
            for subject in subjects {
                match referrers.list(&full, &subject).await? {
                    None => {
                        serves_referrers = false;
                        break;
                    }
                    Some(listed) => {
                        for digest in listed {
                            let entry =
                                by_digest.entry(digest.clone()).or_insert_with(|| Manifest {
                                    digest,
                                    tags: Vec::new(),
                                    subject: None,
                                });
                            entry.subject.get_or_insert(subject.clone());
                        }
                    }
                }
            }
        }
        repositories.push(Repository {
            name,
            manifests: by_digest.into_values().collect(),
        });
    }
    Ok(repositories)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_repositories_under_a_pruned_path_and_never_the_in_use_one() {
        let paths = ["hub".to_string()];
        assert!(pruned("hub/library/nginx", &paths, "image-swapper/in-use"));
        assert!(pruned("hub", &paths, "image-swapper/in-use"));
        assert!(!pruned("hubble/app", &paths, "image-swapper/in-use"));
        assert!(!pruned("team/app", &paths, "image-swapper/in-use"));
        let everything = [String::new()];
        assert!(pruned("team/app", &everything, "image-swapper/in-use"));
        assert!(!pruned(
            "image-swapper/in-use",
            &everything,
            "image-swapper/in-use"
        ));
    }
}
