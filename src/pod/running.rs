//! The digest each container runs, from the Pod's status: what a refill copies when the Pod
//! names a tag, so that the containers' next pull (a restart, a new node) gets the content they
//! run now, whatever the source's tag names today. Read from `status`, which the audit scanner
//! sends with the Pod; an admission's Pod has none, and then nothing is known.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::reference::{Reference, parse_digest};

/// The status lists, beside the spec lists the containers are in.
const STATUS_LISTS: [&str; 3] = [
    "containerStatuses",
    "initContainerStatuses",
    "ephemeralContainerStatuses",
];

/// Container name to the repository digest it runs (`sha256:<hex>`), for the containers whose
/// status names the image their spec names now (same repository and tag: a spec changed since
/// the container started says nothing of what the next start pulls) and whose `imageID` is a
/// repository digest (`repository@sha256:<hex>`, with or without the `docker-pullable://` of
/// older runtimes). An image id without a repository (a local image's configuration digest,
/// which some runtimes report) is no digest any registry serves, and is left out.
pub(super) fn running_digests(object: &Value) -> BTreeMap<String, String> {
    let specs: BTreeMap<&str, &str> = crate::object::named_images(object).collect();
    let mut running = BTreeMap::new();
    let Some(status) = object.get("status") else {
        return running;
    };
    for list in STATUS_LISTS {
        let Some(statuses) = status.get(list).and_then(Value::as_array) else {
            continue;
        };
        for entry in statuses {
            let field = |name: &str| entry.get(name).and_then(Value::as_str);
            let (Some(name), Some(image), Some(id)) =
                (field("name"), field("image"), field("imageID"))
            else {
                continue;
            };
            let Some(spec) = specs.get(name) else {
                continue;
            };
            if !same_image(spec, image) {
                continue;
            }
            if let Some(digest) = repository_digest(id) {
                running.insert(name.to_string(), digest.to_string());
            }
        }
    }
    running
}

/// Whether two spellings name the same repository and tag (`nginx:1.27` and
/// `docker.io/library/nginx:1.27` do; a runtime reports the normalised one).
fn same_image(spec: &str, status: &str) -> bool {
    match (Reference::parse(spec), Reference::parse(status)) {
        (Ok(spec), Ok(status)) => spec.name() == status.name() && spec.tag() == status.tag(),
        _ => false,
    }
}

/// The digest of `repository@sha256:<hex>`, when `id` is one.
fn repository_digest(id: &str) -> Option<&str> {
    let id = id.strip_prefix("docker-pullable://").unwrap_or(id);
    let (repository, digest) = id.rsplit_once('@')?;
    if repository.is_empty() {
        return None;
    }
    parse_digest(digest).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const D: &str = "sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";

    fn pod(spec_image: &str, status_image: &str, image_id: &str) -> Value {
        json!({
            "spec": {"containers": [{"name": "web", "image": spec_image}]},
            "status": {"containerStatuses": [
                {"name": "web", "image": status_image, "imageID": image_id}
            ]}
        })
    }

    #[rstest::rstest]
    #[case::containerd("m.io/hub/library/nginx:1.27", "m.io/hub/library/nginx:1.27", &format!("m.io/hub/library/nginx@{D}"), Some(D))]
    #[case::docker_hub_spelled_short("nginx:1.27", "docker.io/library/nginx:1.27", &format!("docker.io/library/nginx@{D}"), Some(D))]
    #[case::dockershim(
        "m.io/hub/library/nginx:1.27",
        "m.io/hub/library/nginx:1.27",
        &format!("docker-pullable://m.io/hub/library/nginx@{D}"),
        Some(D)
    )]
    #[case::a_configuration_digest_is_no_repository_digest(
        "m.io/hub/library/nginx:1.27",
        "m.io/hub/library/nginx:1.27",
        D,
        None
    )]
    #[case::not_started_yet("m.io/hub/library/nginx:1.27", "m.io/hub/library/nginx:1.27", "", None)]
    #[case::the_spec_changed_since("m.io/hub/library/nginx:1.28", "m.io/hub/library/nginx:1.27", &format!("m.io/hub/library/nginx@{D}"), None)]
    #[case::not_a_digest(
        "m.io/hub/library/nginx:1.27",
        "m.io/hub/library/nginx:1.27",
        "m.io/hub/library/nginx@sha256:zz",
        None
    )]
    fn the_running_digest_is_read_from_a_status_that_names_the_spec_s_image(
        #[case] spec: &str,
        #[case] status: &str,
        #[case] image_id: &str,
        #[case] expected: Option<&str>,
    ) {
        let running = running_digests(&pod(spec, status, image_id));
        assert_eq!(running.get("web").map(String::as_str), expected);
    }

    #[test]
    fn a_pod_without_status_runs_nothing_known() {
        let object = json!({"spec": {"containers": [{"name": "web", "image": "nginx:1.27"}]}});
        assert!(running_digests(&object).is_empty());
    }
}
