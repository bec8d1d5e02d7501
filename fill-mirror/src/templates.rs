//! The watches of the workload kinds' Pod templates (kube-runtime's watcher, one per kind), as
//! the events the fill reads: each object's images keyed `Kind/namespace/name`. With retention
//! on, each watch also reflects its objects into the in-use set's store, so that a kind is
//! watched once for both. A file of its own beside `watch.rs`, which reads the events.

use std::fmt::Debug;

use futures::StreamExt;
use futures::stream::BoxStream;
use image_swapper_policy::plan::pod_key;
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::store::Writer;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde_json::Value;

/// What a workload template watch says: its images, keyed `Kind/namespace/name`.
pub enum TemplateEvent {
    Init(&'static str),
    /// Its images, and its Pods' labels (what the policy's `objectSelector` sees).
    Apply(String, Vec<String>, Value),
    Delete(String),
    InitDone(&'static str),
}

/// The namespace of a template's key, `Kind/namespace/name`.
pub fn namespace_of(key: &str) -> Option<&str> {
    key.split('/').nth(1)
}

/// The images of a Pod template's containers and init containers.
fn template_images(object: &Value, spec: &str) -> Vec<String> {
    let Some(spec) = object.pointer(spec) else {
        return Vec::new();
    };
    ["containers", "initContainers"]
        .iter()
        .filter_map(|list| spec.get(list)?.as_array())
        .flatten()
        .filter_map(|container| Some(container.get("image")?.as_str()?.to_string()))
        .collect()
}

/// The watch of one workload kind, as template events; `spec` is where its Pod spec lies. With
/// `store`, the objects are also kept there (the in-use set's), from the same watch.
pub fn templates_of<K>(
    client: &Client,
    kind: &'static str,
    spec: &'static str,
    store: Option<Writer<K>>,
) -> BoxStream<'static, TemplateEvent>
where
    K: Resource<DynamicType = ()>
        + Clone
        + DeserializeOwned
        + Debug
        + Send
        + Sync
        + serde::Serialize
        + 'static,
{
    let events = watcher::watcher(Api::<K>::all(client.clone()), watcher::Config::default())
        .default_backoff();
    let events = match store {
        Some(store) => events
            .modify(|object| object.managed_fields_mut().clear())
            .reflect(store)
            .boxed(),
        None => events.boxed(),
    };
    events
        .filter_map(move |event| async move {
            let keyed = |object: &K| {
                let value = serde_json::to_value(object).unwrap_or_default();
                (format!("{kind}/{}", pod_key(&value)), value)
            };
            match event {
                Ok(Event::Init) => Some(TemplateEvent::Init(kind)),
                Ok(Event::InitDone) => Some(TemplateEvent::InitDone(kind)),
                Ok(Event::Apply(object) | Event::InitApply(object)) => {
                    let (key, value) = keyed(&object);
                    let labels = spec
                        .strip_suffix("/spec")
                        .and_then(|template| value.pointer(&format!("{template}/metadata/labels")));
                    let labels = labels.cloned().unwrap_or_default();
                    Some(TemplateEvent::Apply(key, template_images(&value, spec), labels))
                }
                Ok(Event::Delete(object)) => Some(TemplateEvent::Delete(keyed(&object).0)),
                Err(error) => {
                    tracing::warn!(%kind, %error, "the watch of the workload templates failed; it resumes, or lists again");
                    None
                }
            }
        })
        .boxed()
}
