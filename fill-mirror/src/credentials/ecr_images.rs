//! ECR's own view of the mirror, for `prune --unanchor-only` on an `--ecr-registry`: ECR lists
//! no catalog, so the inventory is `DescribeRepositories` and `DescribeImages`; and it deletes
//! no tag through the registry endpoint, so an anchor goes by `BatchDeleteImage` naming the tag,
//! which deletes the image with it when it was the image's last tag (ECR's documented rule).

use aws_sdk_ecr::error::DisplayErrorContext;
use aws_sdk_ecr::types::{ImageFailure, ImageIdentifier};

use super::Access;
use crate::retention::inventory::pruned;
use crate::retention::plan::{Manifest, Repository};

impl Access {
    /// Whether `host` is an `--ecr-registry`, whose API this run holds.
    pub fn is_ecr_registry(&self, host: &str) -> bool {
        self.ecr.contains_key(host)
    }

    /// Every image of every repository of the `--ecr-registry` `host` under `paths` (never the
    /// in-use repository), with its tags, as ECR's API describes them: the digest ECR gives is
    /// the manifest's sha256, the one the sets name. ECR says nothing of an image's subject, so
    /// none is set; an artifact carries no anchor and is never acted on here.
    pub async fn ecr_inventory(
        &self,
        host: &str,
        paths: &[String],
        in_use_repository: &str,
    ) -> Result<Vec<Repository>, String> {
        let ecr = (self.ecr.get(host)).ok_or_else(|| format!("{host}: not an --ecr-registry"))?;
        let names: Vec<String> = (ecr.client.describe_repositories())
            .set_registry_id(ecr.registry_id.clone())
            .into_paginator()
            .items()
            .send()
            .try_collect()
            .await
            .map_err(|error| {
                format!(
                    "{host}: DescribeRepositories: {}",
                    DisplayErrorContext(&error)
                )
            })?
            .into_iter()
            .filter_map(|repository| repository.repository_name)
            .filter(|name| pruned(name, paths, in_use_repository))
            .collect();
        let mut repositories = Vec::new();
        for name in names {
            let details = (ecr.client.describe_images())
                .set_registry_id(ecr.registry_id.clone())
                .repository_name(&name)
                .into_paginator()
                .items()
                .send()
                .try_collect()
                .await
                .map_err(|error| {
                    format!(
                        "{host}/{name}: DescribeImages: {}",
                        DisplayErrorContext(&error)
                    )
                })?;
            let mut manifests: Vec<Manifest> = details
                .into_iter()
                .filter_map(|detail| {
                    Some(Manifest {
                        digest: detail.image_digest?,
                        tags: detail.image_tags.unwrap_or_default(),
                        subject: None,
                    })
                })
                .collect();
            manifests.sort_by(|a, b| a.digest.cmp(&b.digest));
            repositories.push(Repository { name, manifests });
        }
        Ok(repositories)
    }

    /// Removes `tags` from `repository` of the `--ecr-registry` `host` in one
    /// `BatchDeleteImage` naming each by `imageTag`: each tag's outcome, in order, a failure
    /// with ECR's code and reason. A tag ECR no longer finds (`ImageNotFound`) is gone already.
    pub async fn ecr_untag(
        &self,
        host: &str,
        repository: &str,
        tags: &[String],
    ) -> Vec<Result<(), String>> {
        let Some(ecr) = self.ecr.get(host) else {
            return tags
                .iter()
                .map(|_| Err(format!("{host}: not an --ecr-registry")))
                .collect();
        };
        let ids = tags
            .iter()
            .map(|tag| ImageIdentifier::builder().image_tag(tag).build())
            .collect();
        let answer = (ecr.client.batch_delete_image())
            .set_registry_id(ecr.registry_id.clone())
            .repository_name(repository)
            .set_image_ids(Some(ids))
            .send()
            .await;
        let answer = match answer {
            Ok(answer) => answer,
            Err(error) => {
                let error = format!("BatchDeleteImage: {}", DisplayErrorContext(&error));
                return tags.iter().map(|_| Err(error.clone())).collect();
            }
        };
        (tags.iter())
            .map(|tag| outcome(tag, answer.failures()))
            .collect()
    }
}

/// One tag's outcome in a `BatchDeleteImage` answer: removed unless a failure names it; a tag
/// ECR no longer finds (`ImageNotFound`) is gone already, any other failure is its code and reason.
fn outcome(tag: &str, failures: &[ImageFailure]) -> Result<(), String> {
    let failure = (failures.iter())
        .find(|failure| failure.image_id().and_then(|id| id.image_tag()) == Some(tag));
    let Some(failure) = failure else {
        return Ok(());
    };
    match failure.failure_code().map(|code| code.as_str()) {
        Some("ImageNotFound") => Ok(()),
        code => Err(format!(
            "BatchDeleteImage: {} {:?}",
            code.unwrap_or("?"),
            failure.failure_reason().unwrap_or_default()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use aws_sdk_ecr::types::ImageFailureCode;

    fn failure(tag: &str, code: ImageFailureCode, reason: &str) -> ImageFailure {
        ImageFailure::builder()
            .image_id(ImageIdentifier::builder().image_tag(tag).build())
            .failure_code(code)
            .failure_reason(reason)
            .build()
    }

    #[test]
    fn each_tag_is_removed_unless_a_failure_names_it_and_not_found_is_gone_already() {
        let failures = [
            failure(
                "inuse-one-aa",
                ImageFailureCode::ImageNotFound,
                "Requested image not found",
            ),
            failure(
                "inuse-two-aa",
                ImageFailureCode::KmsError,
                "the key is disabled",
            ),
        ];
        assert_eq!(outcome("inuse-three-aa", &failures), Ok(()));
        assert_eq!(outcome("inuse-one-aa", &failures), Ok(()));
        assert_eq!(
            outcome("inuse-two-aa", &failures),
            Err("BatchDeleteImage: KmsError \"the key is disabled\"".to_string())
        );
    }
}
