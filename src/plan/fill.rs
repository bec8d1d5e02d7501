//! The record as the fill job reads it: which of a Pod's recorded copies are the policy's own
//! (and so may run with push rights), and the JSON patch that marks entries filled. Here, beside
//! the code that writes the record, so that the fill job (the `fill-mirror` binary) checks a
//! record with the very routing, `exclude` and reference rules the module wrote it with: a
//! second copy of a rule could copy to the wrong place or refuse a good record.

use std::collections::BTreeMap;

use serde_json::{Map, Value, json};

use crate::decide::images::source_image;
use crate::object::{annotation, named_images};
use crate::policy::Policy;
use crate::reference::parse_digest;

use super::copies::{fill_command, signature_command};
use super::copy::Copy;
use super::unmirrored::{Requester, record_unmirrored};
use super::unmirrored::{UNMIRRORED_ANNOTATION, UNMIRRORED_LABEL};

/// One entry of a record the policy would write: its container, the image's copy, and the
/// copy of its cosign signature when the record names one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FillEntry {
    pub container: String,
    pub copy: Copy,
    pub signature: Option<Copy>,
}

/// A Pod's record as the fill job reads it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FillRecord {
    /// The annotation's text as read: what the marking patch tests.
    pub text: String,
    /// The entries whose copies are the policy's own.
    pub entries: Vec<FillEntry>,
    /// One line per entry refused, or for the whole record when it is not well formed; none
    /// of what a line names is run.
    pub notes: Vec<String>,
}

/// `namespace/name` of a Pod, for the notes.
pub fn pod_key(pod: &Value) -> String {
    let field = |name: &str| {
        pod.get("metadata")
            .and_then(|m| m.get(name))
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    format!("{}/{}", field("namespace"), field("name"))
}

/// Why an entry of a record is not well formed, or `None`.
fn entry_problem(container: &str, entry: &Value) -> Option<String> {
    let Some(fields) = entry.as_object() else {
        return Some(format!(
            "container {container:?} is {entry}, not an object with source and copy"
        ));
    };
    for (field, required) in [("source", true), ("copy", true), ("signatureCopy", false)] {
        match fields.get(field) {
            Some(Value::String(_)) => {}
            None if !required => {}
            other => {
                return Some(format!(
                    "container {container:?}: {field} is {}, not a string",
                    other.map_or_else(|| "missing".to_string(), Value::to_string)
                ));
            }
        }
    }
    None
}

/// The record on `pod`, checked against `policy`: `None` when the Pod has none. An entry is
/// run only when it is exactly what the policy writes for the image its container runs now
/// (the source as the container names it, the copy to the first target); a signature copy only
/// when it copies the cosign tag of a digest from the image's source repository to the first
/// target's repository. A record that is not a JSON object of well-formed entries runs nothing.
pub fn read_record(pod: &Value, policy: &Policy) -> Option<FillRecord> {
    let text = annotation(pod, UNMIRRORED_ANNOTATION)?;
    let key = pod_key(pod);
    let mut record = FillRecord {
        text: text.to_string(),
        ..FillRecord::default()
    };
    let Ok(Value::Object(entries)) = serde_json::from_str::<Value>(text) else {
        let start: String = text.chars().take(120).collect();
        record.notes.push(format!(
            "skipped {key}: its record is not a JSON object ({start:?}), none of it run"
        ));
        return Some(record);
    };
    if let Some(problem) = entries
        .iter()
        .find_map(|(container, entry)| entry_problem(container, entry))
    {
        record.notes.push(format!(
            "skipped {key}: its record is not well formed ({problem}), none of it run"
        ));
        return Some(record);
    }
    let running: BTreeMap<&str, &str> = named_images(pod).collect();
    for (container, entry) in &entries {
        let field = |name: &str| entry.get(name).and_then(Value::as_str);
        let recorded_copy = field("copy").unwrap_or_default();
        let own = running
            .get(container.as_str())
            .filter(|image| Some(**image) == field("source"))
            .and_then(|image| source_image(image, policy))
            .filter(|source| fill_command(source) == recorded_copy);
        let (Some(source), Some(copy)) = (own, Copy::parse(recorded_copy)) else {
            record.notes.push(format!(
                "refused {key} container {container}: its record is not the policy's own ({recorded_copy}), not run"
            ));
            continue;
        };
        let signature = match field("signatureCopy") {
            None => None,
            Some(command) => {
                let repository = source.targets.first().map(|t| t.repository());
                let own = Copy::parse(command).filter(|signature| {
                    signature_digest(&signature.source).is_some_and(|digest| {
                        repository.is_some_and(|repository| {
                            signature_command(&source.name, repository, &digest) == command
                        })
                    })
                });
                if own.is_none() {
                    record.notes.push(format!(
                        "refused {key} container {container}: its signature copy is not the policy's own ({command}), not run"
                    ));
                    continue;
                }
                own
            }
        };
        record.entries.push(FillEntry {
            container: container.clone(),
            copy: copy.under(policy, field("source")),
            signature: signature.map(|signature| signature.under(policy, None)),
        });
    }
    Some(record)
}

/// The digest a cosign signature tag (`repository:sha256-<hex>.sig`) names, when it is one.
fn signature_digest(reference: &str) -> Option<String> {
    let (_, tag) = reference.rsplit_once(':')?;
    let hex = tag.strip_prefix("sha256-")?.strip_suffix(".sig")?;
    let digest = format!("sha256:{hex}");
    parse_digest(&digest).ok()?;
    Some(digest)
}

/// The JSON patch that marks the `filled` containers' entries of the record read as `text`:
/// it tests that the record is still that text (the API server refuses the patch otherwise,
/// and the Pod is read again), then removes their entries, and the annotation and the label
/// with the last. `None` when `text` is not a JSON object or nothing it names is filled.
pub fn marking_patch(text: &str, filled: &[&str]) -> Option<Value> {
    let Ok(Value::Object(entries)) = serde_json::from_str::<Value>(text) else {
        return None;
    };
    if !filled.iter().any(|name| entries.contains_key(*name)) {
        return None;
    }
    let kept: Map<String, Value> = entries
        .into_iter()
        .filter(|(name, _)| !filled.contains(&name.as_str()))
        .collect();
    let annotation = format!(
        "/metadata/annotations/{}",
        pointer_token(UNMIRRORED_ANNOTATION)
    );
    let label = format!("/metadata/labels/{}", pointer_token(UNMIRRORED_LABEL));
    let mut patch = vec![json!({"op": "test", "path": annotation, "value": text})];
    if kept.is_empty() {
        patch.push(json!({"op": "remove", "path": annotation}));
        patch.push(json!({"op": "remove", "path": label}));
    } else {
        patch.push(
            json!({"op": "replace", "path": annotation, "value": Value::Object(kept).to_string()}),
        );
    }
    Some(Value::Array(patch))
}

/// A key as one JSON pointer token (RFC 6901: `~` as `~0`, `/` as `~1`).
fn pointer_token(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

/// Writes on `pod` the record admission writes when no target holds the images `absent` (as
/// containers name them): the policy's own writer, for the fill job's tests and tools to make
/// records exactly as the module makes them. Says whether it changed the Pod.
pub fn write_record(pod: &mut Value, absent: &[&str], policy: &Policy) -> bool {
    let absent = absent
        .iter()
        .map(|image| (image.to_string(), None))
        .collect();
    record_unmirrored(pod, None, Requester::Other, &absent, policy)
}

#[cfg(test)]
mod tests {
    use super::super::copies::COPY_COMMAND;
    use super::super::copy::copy_for;
    use super::*;
    use crate::decide::tests::policy_from;

    const SETTINGS: &str = r#"{"mirrors":[
        {"source":"docker.io","targets":[{"target":"m.io/hub"},{"target":"us.m.io/hub"}]}],
        "exclude":["docker.io/library/busybox:*"]}"#;

    fn pod(images: &[(&str, &str)]) -> Value {
        let containers: Vec<Value> = images
            .iter()
            .map(|(name, image)| json!({"name": name, "image": image}))
            .collect();
        json!({"metadata": {"namespace": "ns", "name": "p"}, "spec": {"containers": containers}})
    }

    fn with_record(mut pod: Value, record: Value) -> Value {
        pod["metadata"]["annotations"] = json!({UNMIRRORED_ANNOTATION: record.to_string()});
        pod
    }

    #[test]
    fn the_policy_s_own_record_is_read_back_as_its_copies() {
        let policy = policy_from(SETTINGS);
        let mut object = pod(&[("web", "nginx:1.27"), ("db", "postgres:16")]);
        assert!(write_record(
            &mut object,
            &["nginx:1.27", "postgres:16"],
            &policy
        ));
        let record = read_record(&object, &policy).expect("a record");
        assert_eq!(record.notes, Vec::<String>::new());
        let copies: Vec<String> = record.entries.iter().map(|e| e.copy.to_string()).collect();
        assert_eq!(
            copies,
            [
                "docker.io/library/postgres:16 m.io/hub/library/postgres:16",
                "docker.io/library/nginx:1.27 m.io/hub/library/nginx:1.27",
            ]
        );
    }

    /// A template's image gets exactly the copy a Pod's record names for it; an excluded image
    /// none.
    #[test]
    fn a_template_image_gets_the_copy_a_record_would_name() {
        let policy = policy_from(SETTINGS);
        let mut object = pod(&[("web", "nginx:1.27")]);
        write_record(&mut object, &["nginx:1.27"], &policy);
        let record = read_record(&object, &policy).expect("a record");
        assert_eq!(
            copy_for("nginx:1.27", &policy).as_ref(),
            Some(&record.entries[0].copy)
        );
        assert_eq!(copy_for("busybox:1", &policy), None);
    }

    #[test]
    fn a_pod_without_a_record_has_none() {
        let policy = policy_from(SETTINGS);
        assert_eq!(read_record(&pod(&[("web", "nginx:1.27")]), &policy), None);
    }

    /// A copy steered elsewhere, a source the container does not run, an excluded image, a
    /// second target: none is what the policy writes, so none runs.
    #[rstest::rstest]
    #[case::another_source(
        "nginx:1.27",
        "skopeo copy --all --preserve-digests docker://evil.io/x:1 docker://m.io/hub/library/nginx:1.27"
    )]
    #[case::the_second_target(
        "nginx:1.27",
        "skopeo copy --all --preserve-digests docker://docker.io/library/nginx:1.27 docker://us.m.io/hub/library/nginx:1.27"
    )]
    #[case::another_tag(
        "nginx:1.27",
        "skopeo copy --all --preserve-digests docker://docker.io/library/nginx:1.27 docker://m.io/hub/library/nginx:latest"
    )]
    #[case::an_excluded_image(
        "busybox:1",
        "skopeo copy --all --preserve-digests docker://docker.io/library/busybox:1 docker://m.io/hub/library/busybox:1"
    )]
    #[case::extra_arguments(
        "nginx:1.27",
        "skopeo copy --all --preserve-digests docker://docker.io/library/nginx:1.27 docker://m.io/hub/library/nginx:1.27 --dest-creds x:y"
    )]
    fn a_copy_that_is_not_the_policy_s_own_is_refused(#[case] image: &str, #[case] copy: &str) {
        let policy = policy_from(SETTINGS);
        let object = with_record(
            pod(&[("web", image)]),
            json!({"web": {"source": image, "copy": copy}}),
        );
        let record = read_record(&object, &policy).expect("a record");
        assert_eq!(record.entries, Vec::new());
        assert_eq!(record.notes.len(), 1, "{:?}", record.notes);
        assert!(record.notes[0].starts_with("refused ns/p container web"));
    }

    #[test]
    fn an_entry_for_an_image_the_container_no_longer_runs_is_refused() {
        let policy = policy_from(SETTINGS);
        let mut object = pod(&[("web", "nginx:1.27")]);
        write_record(&mut object, &["nginx:1.27"], &policy);
        object["spec"]["containers"][0]["image"] = json!("nginx:1.28");
        let record = read_record(&object, &policy).expect("a record");
        assert_eq!(record.entries, Vec::new());
        assert_eq!(record.notes.len(), 1);
    }

    #[rstest::rstest]
    #[case::not_json(Value::String("{".into()))]
    #[case::an_entry_not_an_object(json!({"web": 1}))]
    #[case::a_copy_not_a_string(json!({"web": {"source": "nginx:1.27", "copy": 1}}))]
    fn a_record_not_well_formed_runs_nothing(#[case] record: Value) {
        let policy = policy_from(SETTINGS);
        let mut object = pod(&[("web", "nginx:1.27")]);
        let text = match record {
            Value::String(text) => text,
            other => other.to_string(),
        };
        object["metadata"]["annotations"] = json!({UNMIRRORED_ANNOTATION: text});
        let record = read_record(&object, &policy).expect("a record");
        assert_eq!(record.entries, Vec::new());
        assert!(
            record.notes[0].starts_with("skipped ns/p"),
            "{:?}",
            record.notes
        );
    }

    #[test]
    fn a_signature_copy_is_run_only_between_the_image_s_own_repositories() {
        let policy = policy_from(SETTINGS);
        let hex = "c".repeat(64);
        let image = "signed/app:1";
        let copy = "skopeo copy --all --preserve-digests docker://docker.io/signed/app:1 docker://m.io/hub/signed/app:1";
        let good = format!(
            "{COPY_COMMAND} docker://docker.io/signed/app:sha256-{hex}.sig docker://m.io/hub/signed/app:sha256-{hex}.sig"
        );
        let steered = format!(
            "{COPY_COMMAND} docker://evil.io/signed/app:sha256-{hex}.sig docker://m.io/hub/signed/app:sha256-{hex}.sig"
        );
        let read = |signature: &str| {
            let object = with_record(
                pod(&[("web", image)]),
                json!({"web": {"source": image, "copy": copy, "signatureCopy": signature}}),
            );
            read_record(&object, &policy).expect("a record")
        };
        let record = read(&good);
        assert_eq!(record.notes, Vec::<String>::new());
        assert_eq!(
            record.entries[0].signature.as_ref().map(Copy::to_string),
            Some(format!(
                "docker.io/signed/app:sha256-{hex}.sig m.io/hub/signed/app:sha256-{hex}.sig"
            ))
        );
        let record = read(&steered);
        assert_eq!(record.entries, Vec::new());
        assert!(
            record.notes[0].contains("signature copy"),
            "{:?}",
            record.notes
        );
    }

    #[test]
    fn the_marking_patch_tests_the_record_and_drops_only_the_filled_entries() {
        let text = json!({"web": {"source": "a"}, "db": {"source": "b"}}).to_string();
        let patch = marking_patch(&text, &["web"]).expect("a patch");
        let path = "/metadata/annotations/image-swapper.kubewarden.io~1unmirrored-images";
        assert_eq!(
            patch,
            json!([
                {"op": "test", "path": path, "value": text},
                {"op": "replace", "path": path, "value": json!({"db": {"source": "b"}}).to_string()},
            ])
        );
    }

    #[test]
    fn the_last_entry_filled_removes_the_annotation_and_the_label() {
        let text = json!({"web": {"source": "a"}}).to_string();
        let patch = marking_patch(&text, &["web"]).expect("a patch");
        let ops: Vec<(&str, &str)> = patch
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|op| Some((op["op"].as_str()?, op["path"].as_str()?)))
            .collect();
        assert_eq!(
            ops,
            [
                (
                    "test",
                    "/metadata/annotations/image-swapper.kubewarden.io~1unmirrored-images"
                ),
                (
                    "remove",
                    "/metadata/annotations/image-swapper.kubewarden.io~1unmirrored-images"
                ),
                (
                    "remove",
                    "/metadata/labels/image-swapper.kubewarden.io~1unmirrored"
                ),
            ]
        );
        assert_eq!(marking_patch(&text, &["other"]), None);
        assert_eq!(marking_patch("not json", &["web"]), None);
    }
}
