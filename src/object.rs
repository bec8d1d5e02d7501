//! Reading and writing the Pod as JSON: the Pod stays JSON because a typed model would drop the
//! fields it does not know, and the patch computed from the mutated object would then delete them.

use serde_json::{Map, Value};

/// The container lists, in the order their images are looked up.
pub(crate) const CONTAINER_LISTS: [&str; 3] =
    ["containers", "initContainers", "ephemeralContainers"];

pub(crate) fn container_list<'v>(object: &'v Value, list: &str) -> Option<&'v Vec<Value>> {
    object.get("spec")?.get(list)?.as_array()
}

pub(crate) fn container_mut<'v>(
    object: &'v mut Value,
    list: &str,
    index: usize,
) -> Option<&'v mut Map<String, Value>> {
    object
        .get_mut("spec")?
        .get_mut(list)?
        .get_mut(index)?
        .as_object_mut()
}

/// Every container of the Pod's three lists, in order, as (name, image); one without either is
/// skipped.
pub(crate) fn named_images(object: &Value) -> impl Iterator<Item = (&str, &str)> {
    CONTAINER_LISTS
        .into_iter()
        .flat_map(|list| container_list(object, list).into_iter().flatten())
        .filter_map(|container| {
            Some((
                container.get("name")?.as_str()?,
                container.get("image")?.as_str()?,
            ))
        })
}

pub(crate) fn annotation<'v>(object: &'v Value, key: &str) -> Option<&'v str> {
    object
        .get("metadata")?
        .get("annotations")?
        .get(key)?
        .as_str()
}

/// The object under `key`, made an empty object when it is missing or not an object.
pub(crate) fn object_entry<'m>(
    map: &'m mut Map<String, Value>,
    key: &str,
) -> Option<&'m mut Map<String, Value>> {
    let value = map.entry(key).or_insert_with(|| Value::Object(Map::new()));
    if !value.is_object() {
        *value = Value::Object(Map::new());
    }
    value.as_object_mut()
}
