//! The fill job's test rig: the policy repository's own loopback registries and images (shared
//! with the policy's tests, not copied), a loopback control plane, and the binary itself.
#![allow(dead_code)]

#[path = "../../../tests/rig/registry.rs"]
pub mod registry;

#[path = "../../../tests/rig/images.rs"]
pub mod images;

#[path = "../../../tests/rig/proxy.rs"]
pub mod proxy;

#[path = "../../../tests/rig/referrers.rs"]
pub mod referrers;

// ECR's API (moto) and registry endpoint: the policy's rig, by path.
#[path = "../../../tests/rig/ecr.rs"]
pub mod ecr;

// ECR's API of images (DescribeImages, BatchDeleteImage) from the registry's storage.
#[path = "../../../tests/rig/ecr_api.rs"]
pub mod ecr_api;

#[path = "../../../tests/rig/front.rs"]
pub mod front;

// A cache that fills only on a tag, as ECR's pull-through cache does: the policy's rig, by path.
#[path = "../../../tests/rig/pull_through.rs"]
pub mod pull_through;

pub mod alerts;
pub mod api_proxy;
pub mod check;
pub mod hub;
pub mod plane;
pub mod read_only;
pub mod replica;

use std::path::Path;
use std::process::{Command, Output};

use image_swapper_policy::policy::Policy;
use image_swapper_policy::settings::parse_settings;
use serde_json::{Value, json};

/// The binary under test.
pub fn fill_mirror() -> Command {
    Command::new(env!("CARGO_BIN_EXE_fill-mirror"))
}

/// `fill-mirror ARGS`, its status, standard output and error.
pub fn run(args: &[&str]) -> Output {
    fill_mirror()
        .args(args)
        .arg("--log-format")
        .arg("text")
        .output()
        .expect("run fill-mirror")
}

pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Settings that route `source` (a registry host) to `mirror/hub`.
pub fn settings(source: &str, mirror: &str) -> Value {
    json!({"mirrors": [{"source": source, "target": format!("{mirror}/hub")}]})
}

pub fn policy(settings: &Value) -> Policy {
    let parsed = parse_settings(settings.to_string().as_bytes()).expect("settings");
    Policy::from_settings(&parsed).expect("valid settings")
}

/// The record admission writes for container `c0` running `image` (by tag) when the mirror
/// lacks it, written by hand in the form docs/decisions.md shows ("The record of images the
/// mirror lacks"): `mirror` is the first target's image, and the copy goes by tag from the
/// source to it. Not the policy crate's writer: a test holds the fill job's reading against the
/// documented form, so a change of the writer and the reader together still fails.
pub fn hand_written_record(image: &str, mirror: &str) -> String {
    format!(
        r#"{{"c0":{{"source":"{image}","mirror":"{mirror}","copy":"skopeo copy --all --preserve-digests docker://{image} docker://{mirror}"}}}}"#
    )
}

/// Where `rules` (the settings' `mirrors`, each a `source` and a `target`) route `image`, by
/// hand: the image's path under the first source it is under, kept under that rule's target.
pub fn mirror_by_hand(rules: &Value, image: &str) -> String {
    rules
        .as_array()
        .into_iter()
        .flatten()
        .find_map(|rule| {
            let path = image.strip_prefix(&format!("{}/", rule["source"].as_str()?))?;
            Some(format!("{}/{path}", rule["target"].as_str()?))
        })
        .expect("a rule routes the image")
}

/// A Pod of namespace `default` running `image` (container `c0`), labelled and annotated with
/// `hand_written_record(image, mirror)`.
pub fn pod_recorded_by_hand(name: &str, image: &str, mirror: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "default",
            "labels": {"image-swapper.kubewarden.io/unmirrored": "true"},
            "annotations": {
                "image-swapper.kubewarden.io/unmirrored-images": hand_written_record(image, mirror),
            },
        },
        "spec": {"containers": [{"name": "c0", "image": image}]},
    })
}

/// The record admission writes for container `c0` running `image` (host explicit) when the
/// mirror lacks it, under the settings' `mirrors` `rules`, written by hand in the form
/// docs/decisions.md shows: an image by tag is copied to the mirror's tag; a pinned image
/// (`repository:tag@digest`) is recorded as the mirror's repository at that digest, copied by
/// digest to a tag of its own, `sha256-<hex>` ("a pinned image by digest to a tag of its own").
pub fn hand_written_entry(image: &str, rules: &Value) -> Value {
    let mirror = mirror_by_hand(rules, image);
    let Some((named, digest)) = image.split_once('@') else {
        return json!({
            "source": image,
            "mirror": mirror,
            "copy": format!("skopeo copy --all --preserve-digests docker://{image} docker://{mirror}"),
        });
    };
    let repository_of = |named: &str| -> String {
        let (path, last) = named.rsplit_once('/').unwrap_or(("", named));
        let last = last.split_once(':').map_or(last, |(name, _tag)| name);
        format!("{path}/{last}")
    };
    let (source, mirror) = (
        repository_of(named),
        repository_of(mirror.split('@').next().unwrap_or(&mirror)),
    );
    json!({
        "source": image,
        "mirror": format!("{mirror}@{digest}"),
        "copy": format!(
            "skopeo copy --all --preserve-digests docker://{source}@{digest} docker://{mirror}:{}",
            digest.replace(':', "-")
        ),
    })
}

/// A Pod of namespace `default` running `image` (container `c0`), labelled and annotated with
/// [`hand_written_entry`] under the settings' `mirrors` `rules`.
pub fn pod_with_entry_by_hand(name: &str, image: &str, rules: &Value) -> Value {
    let record = json!({"c0": hand_written_entry(image, rules)});
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "default",
            "labels": {"image-swapper.kubewarden.io/unmirrored": "true"},
            "annotations": {"image-swapper.kubewarden.io/unmirrored-images": record.to_string()},
        },
        "spec": {"containers": [{"name": "c0", "image": image}]},
    })
}

pub fn write_json(path: &Path, value: &Value) {
    std::fs::write(path, serde_json::to_vec_pretty(value).expect("JSON")).expect("write");
}
