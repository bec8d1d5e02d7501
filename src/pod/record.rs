//! The original-images record: the annotation that names, for each swapped container, the image
//! the Pod asked for. Read from the live Pod for the re-apply rule, rewritten to describe the Pod
//! as it leaves admission.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use crate::rules::Router;

use super::decisions::Swap;
use crate::object::{annotation, named_images, object_entry};

/// The annotation that records, for each swapped container, the image the Pod asked for.
pub const ORIGINAL_IMAGES_ANNOTATION: &str = "image-swapper.kubewarden.io/original-images";

/// The original-images annotation of `object`, read as container name to image; an entry that
/// is not a string, or an annotation that is not JSON, records nothing.
pub(super) fn recorded_originals(object: &Value) -> BTreeMap<String, String> {
    let Some(text) = annotation(object, ORIGINAL_IMAGES_ANNOTATION) else {
        return BTreeMap::new();
    };
    match serde_json::from_str::<Map<String, Value>>(text) {
        Ok(entries) => entries
            .into_iter()
            .filter_map(|(name, image)| Some((name, image.as_str()?.to_string())))
            .collect(),
        Err(_) => BTreeMap::new(),
    }
}

/// Rewrites the annotation so that it describes the Pod as it leaves admission: a container
/// has an entry when this admission swapped it, or when its recorded original still routes to
/// its image (repository and tag); every other entry goes, and the annotation goes when none
/// is left. Says whether it changed the Pod.
pub(super) fn record_original_images(object: &mut Value, swaps: &[Swap], router: &Router) -> bool {
    let current = annotation(object, ORIGINAL_IMAGES_ANNOTATION);
    if current.is_none() && swaps.iter().all(|s| s.written_back) {
        return false;
    }
    let existing = recorded_originals(object);
    let swapped: BTreeMap<&str, &str> = swaps
        .iter()
        .filter(|s| !s.written_back)
        .map(|s| (s.name.as_str(), s.original.as_str()))
        .collect();
    let mut originals: BTreeMap<&str, &str> = BTreeMap::new();
    for (name, image) in named_images(object) {
        if let Some(original) = swapped.get(name) {
            originals.insert(name, original);
        } else if let Some(original) = existing.get(name)
            && router.is_swap_of(original, image)
        {
            originals.insert(name, original);
        }
    }
    let updated =
        (!originals.is_empty()).then(|| serde_json::to_string(&originals).unwrap_or_default());
    if updated.as_deref() == current {
        return false;
    }
    let Some(annotations) = object
        .as_object_mut()
        .and_then(|pod| object_entry(pod, "metadata"))
        .and_then(|metadata| object_entry(metadata, "annotations"))
    else {
        return false;
    };
    match updated {
        Some(updated) => annotations.insert(
            ORIGINAL_IMAGES_ANNOTATION.to_string(),
            Value::String(updated),
        ),
        None => annotations.remove(ORIGINAL_IMAGES_ANNOTATION),
    };
    true
}
