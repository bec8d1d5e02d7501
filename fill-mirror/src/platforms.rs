//! The platforms the cluster's nodes run: which manifests of an image index a warming pulls, so
//! that a pull-through cache is filled with what the nodes will pull and no more. Read from
//! each Node's `status.nodeInfo` (`operatingSystem`, `architecture`: the kubelet's report of
//! its host), else from its `kubernetes.io/os` and `kubernetes.io/arch` labels (the kubelet
//! sets them too, before its first status); followed by a kube-runtime reflector in the watch,
//! listed once by `once` and `list`, or read from `kubectl get nodes -o json` output.

use std::collections::BTreeSet;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context;
use futures::{FutureExt, StreamExt};
use k8s_openapi::api::core::v1::{Node, NodeStatus};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use serde_json::Value;

/// How long a warming waits for the watch's first list of the nodes, once: a watch not
/// allowed to list them (RBAC) must not hold up every warming.
const FIRST_LIST: Duration = Duration::from_secs(10);

/// An operating system and an architecture, as the OCI image index names them.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Platform {
    pub os: String,
    pub architecture: String,
}

impl fmt::Display for Platform {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.os, self.architecture)
    }
}

impl Platform {
    fn new(os: &str, architecture: &str) -> Option<Platform> {
        let os = os.trim().to_ascii_lowercase();
        let architecture = normalised_architecture(architecture);
        (!os.is_empty() && !architecture.is_empty()).then_some(Platform { os, architecture })
    }
}

/// Go's name for an architecture, which images and nodes both use, from the other spellings
/// found in the wild (containerd's `platforms.normalizeArch` does the same).
fn normalised_architecture(architecture: &str) -> String {
    let architecture = architecture.trim().to_ascii_lowercase();
    match architecture.as_str() {
        "x86_64" | "x86-64" => "amd64".to_string(),
        "aarch64" => "arm64".to_string(),
        "armhf" | "armel" => "arm".to_string(),
        "i386" => "386".to_string(),
        _ => architecture,
    }
}

/// A node's platform: its status's, else its labels'.
pub fn platform_of(node: &Node) -> Option<Platform> {
    let reported = node
        .status
        .as_ref()
        .and_then(|status| status.node_info.as_ref())
        .and_then(|info| Platform::new(&info.operating_system, &info.architecture));
    reported.or_else(|| {
        let labels = node.metadata.labels.as_ref()?;
        Platform::new(
            labels.get("kubernetes.io/os")?,
            labels.get("kubernetes.io/arch")?,
        )
    })
}

/// What a warming knows of the nodes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Known {
    /// The platforms `nodes` nodes run (at least one).
    Platforms {
        platforms: BTreeSet<Platform>,
        nodes: usize,
    },
    /// No node's platform is known, and why: a warming then pulls every platform.
    Unknown(String),
}

impl Known {
    pub fn from_nodes<'a>(nodes: impl IntoIterator<Item = &'a Node>) -> Known {
        let mut platforms = BTreeSet::new();
        let mut count = 0;
        for node in nodes {
            count += 1;
            platforms.extend(platform_of(node));
        }
        if platforms.is_empty() {
            return Known::Unknown(match count {
                0 => "the cluster has no nodes".to_string(),
                n => format!("none of its {n} nodes reports its platform"),
            });
        }
        Known::Platforms {
            platforms,
            nodes: count,
        }
    }

    /// Whether an index's entry (a descriptor) is for a platform the nodes run: its `os` and
    /// `architecture`, any `variant` and `os.version` (nodes report neither; the runtime picks
    /// among them). An entry without a platform is pulled: nothing says no node needs it.
    pub fn wants(&self, entry: &Value) -> bool {
        let Known::Platforms { platforms, .. } = self else {
            return true;
        };
        let Some(platform) = entry.get("platform") else {
            return true;
        };
        let field = |name: &str| platform.get(name).and_then(Value::as_str).unwrap_or("");
        Platform::new(field("os"), field("architecture"))
            .is_some_and(|platform| platforms.contains(&platform))
    }

    /// What a warming pulls, in words: `linux/amd64, linux/arm64 (3 nodes)`, or every
    /// platform and why.
    pub fn describe(&self) -> String {
        match self {
            Known::Platforms { platforms, nodes } => {
                let names: Vec<String> = platforms.iter().map(Platform::to_string).collect();
                let noun = if *nodes == 1 { "node" } else { "nodes" };
                format!("{} ({nodes} {noun})", names.join(", "))
            }
            Known::Unknown(why) => format!("every platform ({why})"),
        }
    }
}

/// Where the nodes' platforms come from: a list read once, or the watch's reflector.
#[derive(Clone)]
pub enum Nodes {
    Fixed(Known),
    Watched {
        store: Store<Node>,
        /// Whether the first list was waited for already.
        waited: Arc<AtomicBool>,
    },
}

impl Nodes {
    /// A reflector of the cluster's Nodes (kube-runtime's watcher: list, watch, resume, relist
    /// and backoff), run on a task of its own. Each Node is kept as its platform's fields only:
    /// a Node's status lists its images and conditions, which a large cluster holds by the
    /// megabyte.
    pub fn watch(client: Client) -> Nodes {
        let (store, writer) = reflector::store();
        let following = watcher::watcher(Api::<Node>::all(client), watcher::Config::default())
            .default_backoff()
            .modify(keep_the_platform)
            .reflect(writer)
            .for_each(|event| async move {
                if let Err(error) = event {
                    tracing::warn!(%error, "the watch of the nodes failed; it resumes, or lists again (until it lists them, a warming pulls every platform)");
                }
            });
        tokio::spawn(following);
        Nodes::Watched {
            store,
            waited: Arc::new(AtomicBool::new(false)),
        }
    }

    /// What is known now. The watch's first list is waited for once, up to [`FIRST_LIST`].
    pub async fn known(&self) -> Known {
        match self {
            Nodes::Fixed(known) => known.clone(),
            Nodes::Watched { store, waited } => {
                if !waited.swap(true, Ordering::SeqCst) {
                    let _ = tokio::time::timeout(FIRST_LIST, store.wait_until_ready()).await;
                }
                match store.wait_until_ready().now_or_never() {
                    Some(Ok(())) => Known::from_nodes(store.state().iter().map(|n| n.as_ref())),
                    _ => Known::Unknown(
                        "the nodes are not listed yet: may this identity list and watch nodes?"
                            .to_string(),
                    ),
                }
            }
        }
    }
}

/// A Node reduced to what [`platform_of`] reads.
fn keep_the_platform(node: &mut Node) {
    node.spec = None;
    node.status = node
        .status
        .take()
        .and_then(|status| status.node_info)
        .map(|info| NodeStatus {
            node_info: Some(info),
            ..NodeStatus::default()
        });
    node.metadata.annotations = None;
    node.metadata.managed_fields = None;
    if let Some(labels) = node.metadata.labels.as_mut() {
        labels.retain(|key, _| key == "kubernetes.io/os" || key == "kubernetes.io/arch");
    }
}

/// The Nodes from `kubectl get nodes -o json` output files (a list or single objects).
pub fn nodes_from_files(paths: &[String]) -> anyhow::Result<Vec<Node>> {
    let mut nodes = Vec::new();
    for path in paths {
        let text = std::fs::read(path).with_context(|| format!("--nodes {path}: cannot read"))?;
        let stream = serde_json::Deserializer::from_slice(&text).into_iter::<Value>();
        for document in stream {
            let document = document.with_context(|| {
                format!("--nodes {path}: not JSON (kubectl get nodes -o json output)")
            })?;
            let items = match document.get("items").and_then(Value::as_array) {
                Some(items) => items.clone(),
                None => vec![document],
            };
            for item in items {
                nodes.push(
                    serde_json::from_value(item)
                        .with_context(|| format!("--nodes {path}: an item is not a Node"))?,
                );
            }
        }
    }
    Ok(nodes)
}

/// What the cluster's nodes run, listed once; unknown (with the API server's words) when they
/// cannot be listed.
pub async fn known_in_cluster(client: &Client) -> Known {
    let api: Api<Node> = Api::all(client.clone());
    match api.list(&kube::api::ListParams::default()).await {
        Ok(list) => Known::from_nodes(&list.items),
        Err(error) => Known::Unknown(format!("cannot list the nodes: {error}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn node(info: Option<(&str, &str)>, labels: Option<(&str, &str)>) -> Node {
        let mut node = json!({"metadata": {"name": "n"}});
        if let Some((os, arch)) = info {
            node["status"] = json!({"nodeInfo": {
                "operatingSystem": os, "architecture": arch, "bootID": "", "containerRuntimeVersion": "",
                "kernelVersion": "", "kubeProxyVersion": "", "kubeletVersion": "", "machineID": "",
                "osImage": "", "systemUUID": ""}});
        }
        if let Some((os, arch)) = labels {
            node["metadata"]["labels"] =
                json!({"kubernetes.io/os": os, "kubernetes.io/arch": arch});
        }
        serde_json::from_value(node).expect("a Node")
    }

    #[rstest::rstest]
    #[case::its_status(Some(("linux", "amd64")), Some(("linux", "arm64")), Some("linux/amd64"))]
    #[case::its_labels_before_its_first_status(None, Some(("linux", "arm64")), Some("linux/arm64"))]
    #[case::another_spelling(Some(("Linux", "aarch64")), None, Some("linux/arm64"))]
    #[case::nothing_said(None, None, None)]
    fn a_node_s_platform_is_its_status_s_else_its_labels(
        #[case] info: Option<(&str, &str)>,
        #[case] labels: Option<(&str, &str)>,
        #[case] expected: Option<&str>,
    ) {
        assert_eq!(
            platform_of(&node(info, labels))
                .map(|p| p.to_string())
                .as_deref(),
            expected
        );
    }

    #[rstest::rstest]
    #[case::the_nodes_platform(json!({"os": "linux", "architecture": "amd64"}), true)]
    #[case::any_variant_of_it(json!({"os": "linux", "architecture": "amd64", "variant": "v3"}), true)]
    #[case::another_architecture(json!({"os": "linux", "architecture": "arm64"}), false)]
    #[case::another_os(json!({"os": "windows", "architecture": "amd64", "os.version": "10.0.17763.1"}), false)]
    #[case::a_buildkit_attestation(json!({"os": "unknown", "architecture": "unknown"}), false)]
    fn an_index_entry_is_wanted_when_a_node_runs_its_platform(
        #[case] platform: Value,
        #[case] wanted: bool,
    ) {
        let known = Known::from_nodes(&[
            node(Some(("linux", "amd64")), None),
            node(Some(("linux", "x86_64")), None),
        ]);
        assert_eq!(known.describe(), "linux/amd64 (2 nodes)");
        assert_eq!(
            known.wants(&json!({"digest": "sha256:00", "platform": platform})),
            wanted
        );
    }

    #[test]
    fn with_no_node_known_every_entry_is_wanted() {
        let none = Known::from_nodes(&[]);
        assert_eq!(none, Known::Unknown("the cluster has no nodes".to_string()));
        assert!(none.wants(&json!({"platform": {"os": "linux", "architecture": "s390x"}})));
        let silent = Known::from_nodes(&[node(None, None)]);
        assert!(silent.describe().starts_with("every platform"));
        let known = Known::from_nodes(&[node(Some(("linux", "arm64")), None)]);
        assert!(known.wants(&json!({"digest": "sha256:00"})));
    }
}
