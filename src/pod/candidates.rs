//! Step 1 of an admission: which containers of the Pod to decide on, in lookup order. Separate
//! because it alone reads `oldObject` to tell which images an update changed.

use std::collections::BTreeMap;

use serde_json::Value;

use kubewarden_policy_sdk::request::KubernetesAdmissionRequest;

use crate::object::{CONTAINER_LISTS, container_list};

use super::request::Operation;

/// The only list the API server keeps from a `pods/ephemeralcontainers` request: deciding the
/// others would look up, warn about and even reject changes that are thrown away.
pub(super) const EPHEMERAL_LIST: [&str; 1] = ["ephemeralContainers"];

/// A container whose image this admission may change.
pub(super) struct Candidate<'o> {
    pub(super) list: &'static str,
    pub(super) index: usize,
    pub(super) name: &'o str,
    pub(super) image: &'o str,
    /// Its image in `oldObject`, on update.
    pub(super) old_image: Option<&'o str>,
}

/// The containers to decide on, in container order, from `lists`. On update, only containers
/// whose image changed, and ephemeral containers that were added: changing the image of a
/// running container restarts it, so an update that did not touch an image must not touch it
/// either.
pub(super) fn candidates<'o>(
    object: &'o Value,
    old: Option<&'o Value>,
    lists: &[&'static str],
) -> Vec<Candidate<'o>> {
    let mut candidates = Vec::new();
    for &list in lists {
        let Some(containers) = container_list(object, list) else {
            continue;
        };
        // Name to image in the old Pod, so that the comparison stays linear in the containers.
        let old_images: BTreeMap<&str, &str> = old
            .and_then(|old| container_list(old, list))
            .into_iter()
            .flatten()
            .filter_map(|o| Some((o.get("name")?.as_str()?, o.get("image")?.as_str()?)))
            .collect();
        for (index, container) in containers.iter().enumerate() {
            let name = container
                .get("name")
                .and_then(Value::as_str)
                .unwrap_or_default();
            let Some(image) = container.get("image").and_then(Value::as_str) else {
                continue;
            };
            let old_image = old_images.get(name).copied();
            if old.is_none() || old_image != Some(image) {
                candidates.push(Candidate {
                    list,
                    index,
                    name,
                    image,
                    old_image,
                });
            }
        }
    }
    candidates
}

/// The containers an admission decides on: on update, only those whose image changed.
pub(super) fn changed_containers(
    request: &KubernetesAdmissionRequest,
    operation: Operation,
) -> Vec<Candidate<'_>> {
    let old = match operation {
        Operation::Create => None,
        _ => Some(&request.old_object),
    };
    let lists: &[&str] = match operation {
        Operation::EphemeralContainers => &EPHEMERAL_LIST,
        _ => &CONTAINER_LISTS,
    };
    candidates(&request.object, old, lists)
}
