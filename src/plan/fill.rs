//! The record as the fill job reads it: which of a Pod's recorded copies are the policy's own
//! (and so may run with push rights), and the JSON patch that marks entries filled. Here, beside
//! the code that writes the record, so that the fill job (the `fill-mirror` binary) checks a
//! record with the very routing, `exclude` and reference rules the module wrote it with: a
//! second copy of a rule could copy to the wrong place or refuse a good record.

use std::collections::BTreeMap;

use serde_json::{Map, Value, json};

use crate::decide::images::source_image;
use crate::policy::Policy;
use crate::reference::parse_digest;

pub use super::copies::COPY_COMMAND;
use super::copies::{fill_command, signature_command};
use super::unmirrored::{Requester, record_unmirrored};
use super::unmirrored::{UNMIRRORED_ANNOTATION, UNMIRRORED_LABEL};
use super::warm::{Warm, warm_for};
use crate::object::{annotation, named_images};

/// One copy: `skopeo copy --all --preserve-digests docker://SOURCE docker://DESTINATION`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Copy {
    pub source: String,
    pub destination: String,
    /// Set when the destination lies under a target marked `pullThrough`: the manifest GET
    /// that fills the cache instead of the push, which a cache refuses ([`Copy::under`]).
    pub warm: Option<Warm>,
}

impl Copy {
    /// The copy a command in the policy's form names: exactly [`COPY_COMMAND`], then
    /// `docker://SOURCE docker://DESTINATION`, both in the reference grammar's characters.
    /// Anything else is `None`: a command is never run, only read.
    pub fn parse(command: &str) -> Option<Copy> {
        let rest = command.strip_prefix(COPY_COMMAND)?.strip_prefix(' ')?;
        let (source, destination) = rest.split_once(' ')?;
        let source = source.strip_prefix("docker://")?;
        let destination = destination.strip_prefix("docker://")?;
        let grammar = |text: &str| {
            !text.is_empty()
                && text
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"._:@/-".contains(&b))
        };
        (grammar(source) && grammar(destination)).then(|| Copy {
            source: source.to_string(),
            destination: destination.to_string(),
            warm: None,
        })
    }

    /// This copy as `policy` fills its destination: warmed instead of pushed when the
    /// destination lies under a pull-through cache. `image` is what the Pod or template names,
    /// when known (its tag is what the cache fills on; [`Warm`]).
    pub fn under(mut self, policy: &Policy, image: Option<&str>) -> Copy {
        self.warm = warm_for(&self.source, &self.destination, image, policy);
        self
    }

    /// The registry host of the source: what a backoff on 429 and 5xx is kept for.
    pub fn source_host(&self) -> &str {
        self.source.split('/').next().unwrap_or_default()
    }

    /// The registry host of the destination: the target registry the metrics name.
    pub fn destination_host(&self) -> &str {
        self.destination.split('/').next().unwrap_or_default()
    }
}

impl std::fmt::Display for Copy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.source, self.destination)
    }
}

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

/// The copy that fills the mirror with `image` ahead of any Pod (a workload template names
/// it): the one a Pod's record would name for a container running it, or `None` when no rule
/// routes it (unmatched, excluded, already under a target, not a reference).
pub fn copy_for(image: &str, policy: &Policy) -> Option<Copy> {
    source_image(image, policy)
        .and_then(|source| Copy::parse(&fill_command(&source)))
        .map(|copy| copy.under(policy, Some(image)))
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

/// The copies a check role's result message names, in order: each [`COPY_COMMAND`] followed by
/// `docker://SOURCE docker://DESTINATION`, both ending at the first character outside the
/// reference grammar (the check role writes them inside parentheses and sentences).
pub fn copies_in_message(message: &str) -> Vec<Copy> {
    let grammar = |b: u8| b.is_ascii_alphanumeric() || b"._:@/-".contains(&b);
    let reference = |text: &str| -> Option<(String, usize)> {
        let rest = text.strip_prefix("docker://")?;
        let end = rest.bytes().position(|b| !grammar(b)).unwrap_or(rest.len());
        (end > 0).then(|| (rest[..end].to_string(), "docker://".len() + end))
    };
    let mut copies = Vec::new();
    let mut rest = message;
    while let Some(at) = rest.find(COPY_COMMAND) {
        rest = &rest[at + COPY_COMMAND.len()..];
        let Some(after) = rest.strip_prefix(' ') else {
            continue;
        };
        let Some((source, used)) = reference(after) else {
            continue;
        };
        let Some(after_source) = after[used..].strip_prefix(' ') else {
            continue;
        };
        let Some((destination, _)) = reference(after_source) else {
            continue;
        };
        copies.push(Copy {
            source,
            destination,
            warm: None,
        });
    }
    copies
}

/// Why a copy a report names is not one the policy writes under `policy`, or `None` when it
/// is. A report's result can be written by anyone who can write reports, so its copy runs only
/// when it is what the check role writes: the source a reference a rule routes to a mirror (not
/// excluded, not a mirror image), in its normal form; the destination one of that rule's target
/// repositories with a tag: the digest's own tag (`sha256-<hex>`) for a copy by digest, the same
/// tag for a copy by tag (a signature's `sha256-<hex>.sig` is a tag). So a copy never moves a
/// tag to other content, and never lands where the rules do not route its source.
pub fn report_copy_problem(copy: &Copy, policy: &Policy) -> Option<String> {
    let Some(source) = source_image(&copy.source, policy) else {
        return Some(format!(
            "no rule of the settings routes {} to a mirror (unmatched, excluded, or a mirror image itself)",
            copy.source
        ));
    };
    if source.source != copy.source {
        return Some(format!(
            "its source {} is not in the form the policy writes ({})",
            copy.source, source.source
        ));
    }
    let split = copy
        .destination
        .rsplit_once(':')
        .filter(|(repository, tag)| !tag.contains('/') && !repository.contains('@'));
    let Some((repository, tag)) = split else {
        return Some(format!(
            "its destination {} is not a repository and a tag",
            copy.destination
        ));
    };
    let repositories: Vec<&str> = source.targets.iter().map(|t| t.repository()).collect();
    if !repositories.contains(&repository) {
        return Some(format!(
            "the settings route {} to {}, not {repository}",
            source.name,
            repositories.join(" or ")
        ));
    }
    let wanted = match source.targets.first().and_then(|t| t.digest()) {
        Some(digest) => digest.replacen(':', "-", 1),
        None => source.source[source.name.len()..]
            .trim_start_matches(':')
            .to_string(),
    };
    (tag != wanted).then(|| {
        let by = if source.targets.first().and_then(|t| t.digest()).is_some() {
            "a copy by digest goes to the digest's own tag"
        } else {
            "a copy by tag goes to the same tag"
        };
        format!("{by} {wanted}, not {tag}")
    })
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

    /// The copies a message names, as the check role writes them in sentences and parentheses;
    /// a command that is not the policy's form is not read.
    #[test]
    fn copies_are_read_out_of_a_message_as_the_check_role_writes_them() {
        let message = "containers \"web\": image \"m.io/hub/app:1@sha256:aa\" is not in the mirror: it was swapped from \"app:1\": refill the mirror (skopeo copy --all --preserve-digests docker://docker.io/library/app@sha256:aa docker://m.io/hub/library/app:sha256-aa) or roll out; skopeo copy --all docker://x docker://y; skopeo copy --all --preserve-digests docker://docker.io/library/web:2 docker://m.io/hub/library/web:2; roll out.";
        let copies: Vec<String> = copies_in_message(message)
            .iter()
            .map(Copy::to_string)
            .collect();
        assert_eq!(
            copies,
            [
                "docker.io/library/app@sha256:aa m.io/hub/library/app:sha256-aa",
                "docker.io/library/web:2 m.io/hub/library/web:2",
            ]
        );
    }

    /// A report's copy runs only when it is what the check role writes for its source.
    #[rstest::rstest]
    #[case::by_tag("docker.io/library/web:2", "m.io/hub/library/web:2", None)]
    #[case::to_the_second_target("docker.io/library/web:2", "us.m.io/hub/library/web:2", None)]
    #[case::by_digest_to_its_own_tag(
        "docker.io/library/web@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
        "m.io/hub/library/web:sha256-0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
        None
    )]
    #[case::a_signature_tag(
        "docker.io/library/web:sha256-0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef.sig",
        "m.io/hub/library/web:sha256-0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef.sig",
        None
    )]
    #[case::a_moved_tag(
        "docker.io/library/web:2",
        "m.io/hub/library/web:3",
        Some("a copy by tag goes to the same tag 2, not 3")
    )]
    #[case::a_digest_over_a_tag(
        "docker.io/library/web@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
        "m.io/hub/library/web:2",
        Some(
            "a copy by digest goes to the digest's own tag sha256-0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef, not 2"
        )
    )]
    #[case::elsewhere(
        "docker.io/library/web:2",
        "evil.io/library/web:2",
        Some(
            "the settings route docker.io/library/web to m.io/hub/library/web or us.m.io/hub/library/web, not evil.io/library/web"
        )
    )]
    #[case::excluded(
        "docker.io/library/busybox:1",
        "m.io/hub/library/busybox:1",
        Some(
            "no rule of the settings routes docker.io/library/busybox:1 to a mirror (unmatched, excluded, or a mirror image itself)"
        )
    )]
    #[case::not_normal(
        "web:2",
        "m.io/hub/library/web:2",
        Some("its source web:2 is not in the form the policy writes (docker.io/library/web:2)")
    )]
    #[case::no_tag(
        "docker.io/library/web:2",
        "m.io/hub/library/web@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
        Some(
            "its destination m.io/hub/library/web@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef is not a repository and a tag"
        )
    )]
    fn a_report_s_copy_is_checked_as_the_policy_writes_it(
        #[case] source: &str,
        #[case] destination: &str,
        #[case] problem: Option<&str>,
    ) {
        let policy = policy_from(SETTINGS);
        let copy = Copy {
            source: source.to_string(),
            destination: destination.to_string(),
            warm: None,
        };
        assert_eq!(
            report_copy_problem(&copy, &policy).as_deref(),
            problem,
            "{copy}"
        );
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

    #[rstest::rstest]
    #[case::the_form(
        "skopeo copy --all --preserve-digests docker://a.io/x:1 docker://m.io/x:1",
        true
    )]
    #[case::no_scheme(
        "skopeo copy --all --preserve-digests a.io/x:1 docker://m.io/x:1",
        false
    )]
    #[case::a_shell_character(
        "skopeo copy --all --preserve-digests docker://a.io/x:1;rm docker://m.io/x:1",
        false
    )]
    #[case::another_flag(
        "skopeo copy --all --preserve-digests --remove-signatures docker://a.io/x:1 docker://m.io/x:1",
        false
    )]
    fn only_the_policy_s_copy_form_is_read(#[case] command: &str, #[case] read: bool) {
        assert_eq!(Copy::parse(command).is_some(), read);
    }
}
