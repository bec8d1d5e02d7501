//! Who the binary is at each registry, and how it reaches each registry's TLS: the docker config
//! a Secret mounts, merged with the tokens the binary gets by itself (ECR's from its AWS
//! identity, Artifact Registry's from the GKE metadata server) into the one auth file skopeo
//! reads; ECR repositories made before a copy when asked to; and Kubewarden's `sources.yaml`
//! (insecure hosts, private CAs) read as policy-server reads it. Kept apart from the copy engine
//! so that `skopeo.rs` only turns these into arguments.

mod auth_file;
mod ecr;
mod ecr_images;
mod gar;
mod source_namespaces;
mod sources;

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::os::unix::fs::DirBuilderExt;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::Context;
use image_swapper_policy::reference::Reference;

use auth_file::{merge, read_user_file, write_private};
pub use ecr::ecr_host;
use ecr::{Ecr, ecr_clients, ecr_token};
use gar::{METADATA_HOST, gar_token};
pub use source_namespaces::SourceNamespaces;
use sources::{Sources, valid_host};

/// The flags of registry access, shared by `once` and `watch`.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct AccessArgs {
    /// A docker config JSON with the credentials of the mirror and the sources (a mounted
    /// kubernetes.io/dockerconfigjson Secret); read again before each copy, never written.
    #[arg(long, env = "REGISTRY_AUTH_FILE")]
    pub auth_file: Option<PathBuf>,
    /// An ECR registry (<account>.dkr.ecr.<region>.amazonaws.com) whose push token the binary
    /// gets from its own AWS identity (IRSA, EKS Pod Identity, env). Repeatable.
    #[arg(
        long = "ecr-registry",
        env = "FILL_MIRROR_ECR_REGISTRIES",
        value_delimiter = ','
    )]
    pub ecr_registries: Vec<String>,
    /// Before a copy to an --ecr-registry, create its repository when it does not exist (the
    /// fallback where no ECR repository creation template with CREATE_ON_PUSH applies).
    #[arg(long)]
    pub ecr_create_repositories: bool,
    /// The tag mutability of the repositories --ecr-create-repositories creates:
    /// IMMUTABLE_WITH_EXCLUSION, every tag immutable but cosign's signature tags (sha256-*.sig, .att, .sbom),
    /// which follow their source (a re-signed image's signature is copied over); IMMUTABLE
    /// refuses that copy; MUTABLE.
    #[arg(
        long,
        default_value = "IMMUTABLE_WITH_EXCLUSION",
        value_parser = ["IMMUTABLE_WITH_EXCLUSION", "IMMUTABLE", "MUTABLE"]
    )]
    pub ecr_image_tag_mutability: String,
    /// An Artifact Registry host (e.g. europe-docker.pkg.dev) whose access token the binary
    /// gets from the GKE metadata server (Workload Identity). Repeatable.
    #[arg(long = "gar-registry")]
    pub gar_registries: Vec<String>,
    /// Kubewarden's sources.yaml (insecure_sources, source_authorities), the file policy-server
    /// reads with the same flag.
    #[arg(long, env = "KUBEWARDEN_SOURCES_PATH")]
    pub sources_path: Option<PathBuf>,
    /// HOST=NAMESPACE[,NAMESPACE...] (`*`: any namespace): a copy from source registry HOST
    /// uses the login the auth file (or an --ecr-registry or --gar-registry token) holds for it
    /// only when a listed namespace asks for it; otherwise it reads HOST anonymously.
    /// Repeatable; in the environment, separated by spaces.
    #[arg(
        long = "source-namespaces",
        env = "FILL_MIRROR_SOURCE_NAMESPACES",
        value_delimiter = ' '
    )]
    pub source_namespaces: Vec<String>,
}

/// When a token that expires at `expires` (got at `now`) is fetched again: at half its
/// remaining life, so a 12-hour ECR token is renewed after 6 hours and a failed renewal has
/// hours to succeed; at once when it has expired already.
pub fn refresh_at(now: SystemTime, expires: SystemTime) -> SystemTime {
    match expires.duration_since(now) {
        Ok(left) if !left.is_zero() => now + left / 2,
        _ => now,
    }
}

/// The registry host an image names (its domain as the policy normalises it), or its text
/// before the first `/` when it does not parse.
pub fn host_of(image: &str) -> String {
    match Reference::parse(image) {
        Ok(reference) => reference.domain().to_string(),
        Err(_) => image.split('/').next().unwrap_or_default().to_string(),
    }
}

/// A token and when to fetch it again.
#[derive(Clone, Debug)]
struct Token {
    /// base64 of `user:password`, a docker config's `auth`.
    auth: String,
    refresh: SystemTime,
    expires: SystemTime,
}

/// The tokens and the merged auth file.
struct Logins {
    user_file: Option<PathBuf>,
    /// The merged file skopeo reads, in the private folder.
    path: PathBuf,
    gar: BTreeSet<String>,
    metadata: String,
    state: tokio::sync::Mutex<LoginState>,
}

/// The tokens got so far, and the auth file as last written.
#[derive(Default)]
struct LoginState {
    tokens: BTreeMap<String, Token>,
    written: Option<Vec<u8>>,
}

/// Registry access for skopeo.
pub struct Access {
    /// `--insecure`: every registry plain HTTP or unverified TLS.
    insecure: bool,
    sources: Sources,
    /// `--source-namespaces`: whose copies may use a source host's login.
    source_namespaces: SourceNamespaces,
    logins: Option<Logins>,
    ecr: BTreeMap<String, Ecr>,
    /// `--ecr-create-repositories`: the tag mutability of what it creates.
    create: Option<String>,
    /// ECR repositories known to exist, asked once per run.
    known: Mutex<HashSet<(String, String)>>,
    /// The private folder (mode 0700): the merged auth file and the certs folders.
    folder: PathBuf,
}

/// Names the hosts and files only: the tokens never reach a log line.
impl std::fmt::Debug for Access {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Access")
            .field("insecure", &self.insecure)
            .field("sources", &self.sources)
            .field("ecr", &self.ecr.keys().collect::<Vec<_>>())
            .field("gar", &self.logins.as_ref().map(|l| &l.gar))
            .field("create", &self.create)
            .field("folder", &self.folder)
            .finish()
    }
}

impl Drop for Access {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.folder);
    }
}

/// The name of a folder only this user will read, under the temporary folder (an emptyDir in
/// the Pod: the root file system is read-only).
fn private_folder_name() -> PathBuf {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or_default();
    std::env::temp_dir().join(format!("fill-mirror-{}-{nanos}", std::process::id()))
}

/// Makes the private folder (mode 0700), only when there is something to write in it (an auth
/// file, certificates): a run with neither writes nothing at all.
fn make_private(folder: &std::path::Path) -> anyhow::Result<()> {
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(folder)
        .with_context(|| format!("cannot make the private folder {}", folder.display()))
}

impl Access {
    pub async fn new(args: &AccessArgs, insecure: bool) -> anyhow::Result<Access> {
        let folder = private_folder_name();
        let mut access = Access {
            insecure,
            sources: Sources::default(),
            source_namespaces: SourceNamespaces::parse(&args.source_namespaces)?,
            logins: None,
            ecr: BTreeMap::new(),
            create: None,
            known: Mutex::new(HashSet::new()),
            folder: folder.clone(),
        };
        if let Some(path) = &args.sources_path {
            make_private(&folder)?;
            access.sources = Sources::load(path, &folder.join("certs"))?;
        }
        if !args.ecr_registries.is_empty() {
            access.ecr = ecr_clients(&args.ecr_registries).await?;
        }
        let ecr_hosts: BTreeSet<&String> = access.ecr.keys().collect();
        for host in &args.gar_registries {
            anyhow::ensure!(
                valid_host(host) && !ecr_hosts.contains(host),
                "--gar-registry {host:?}: not a registry host, or also an --ecr-registry"
            );
        }
        if args.ecr_create_repositories {
            anyhow::ensure!(
                !access.ecr.is_empty(),
                "--ecr-create-repositories needs an --ecr-registry to create repositories in"
            );
            access.create = Some(args.ecr_image_tag_mutability.clone());
        }
        if args.auth_file.is_some() || !access.ecr.is_empty() || !args.gar_registries.is_empty() {
            if let Some(user_file) = &args.auth_file {
                let user = read_user_file(user_file)?;
                let auths = user.get("auths").and_then(serde_json::Value::as_object);
                let hosts = auths.into_iter().flat_map(|a| a.keys().map(String::as_str));
                let unlisted = access.source_namespaces.unlisted(hosts);
                if !unlisted.is_empty() {
                    tracing::warn!(
                        hosts = unlisted.join(" "),
                        "the auth file's logins for these hosts are used for no copy's source (only to push to the mirror): a source registry is read anonymously unless --source-namespaces HOST=NAMESPACE,... lists the namespaces whose copies may use its login"
                    );
                }
            }
            if !folder.exists() {
                make_private(&folder)?;
            }
            let metadata = std::env::var("GCE_METADATA_HOST")
                .ok()
                .filter(|host| !host.is_empty())
                .unwrap_or_else(|| METADATA_HOST.to_string());
            access.logins = Some(Logins {
                user_file: args.auth_file.clone(),
                path: folder.join("auth.json"),
                gar: args.gar_registries.iter().cloned().collect(),
                metadata: format!("http://{metadata}"),
                state: tokio::sync::Mutex::new(LoginState::default()),
            });
            // The file exists before the first copy asks for it, with the user's entries.
            access.fresh(&[]).await.map_err(anyhow::Error::msg)?;
        }
        Ok(access)
    }

    /// Before a copy: the logins of its two hosts fresh in the auth file.
    pub async fn prepare(&self, source: &str, destination: &str) -> Result<(), String> {
        self.fresh(&[host_of(source), host_of(destination)]).await
    }

    /// Whether a copy to `destination` would create its ECR repository first
    /// (`--ecr-create-repositories`, an `--ecr-registry` host, a repository not yet seen): the
    /// copy then asks the source first, so that no repository is made for an image that is gone.
    pub fn creates_repository(&self, destination: &str) -> bool {
        self.create.is_some()
            && self
                .repository_key(destination)
                .is_some_and(|key| !self.known.lock().is_ok_and(|known| known.contains(&key)))
    }

    /// With `--ecr-create-repositories`: the ECR repository of `destination` made when ECR
    /// says it does not exist.
    pub async fn make_repository(&self, destination: &str) -> Result<(), String> {
        match &self.create {
            Some(mutability) => self.repository(destination, mutability).await,
            None => Ok(()),
        }
    }

    /// The login skopeo gets for `host` from the auth file it reads (base64 of
    /// `user:password`): the binary's own token for an `--ecr-registry` or `--gar-registry`
    /// host, else the user's entry; None without one.
    pub async fn login(&self, host: &str) -> Result<Option<String>, String> {
        let Some(logins) = &self.logins else {
            return Ok(None);
        };
        self.fresh(&[host.to_string()]).await?;
        if let Some(token) = logins.state.lock().await.tokens.get(host) {
            return Ok(Some(token.auth.clone()));
        }
        let Some(path) = &logins.user_file else {
            return Ok(None);
        };
        let user = read_user_file(path).map_err(|e| format!("{e:#}"))?;
        Ok(auth_file::entry(&user, host))
    }

    /// Whether a copy `requesters` (namespaces) ask for may use source `host`'s login.
    pub fn source_login_for(&self, host: &str, requesters: &BTreeSet<String>) -> bool {
        self.source_namespaces.allows(host, requesters)
    }

    /// Whether `host` is asked over plain HTTP (or unverified TLS): `--insecure`, or named in
    /// sources.yaml's `insecure_sources`.
    pub fn plain_http(&self, host: &str) -> bool {
        self.insecure || self.sources.insecure.contains(host)
    }

    /// The CA bundles sources.yaml's `source_authorities` gave, one file per host (`host[:port]`,
    /// as sources.yaml names it): each is trusted for its own host only, as skopeo's
    /// `--cert-dir` is.
    pub fn authorities(&self) -> BTreeMap<String, PathBuf> {
        self.sources
            .cert_dirs
            .iter()
            .map(|(host, dir)| (host.clone(), dir.join("ca.crt")))
            .collect()
    }

    /// skopeo's options for `skopeo inspect` of `image`.
    pub fn inspect_args(&self, image: &str) -> Vec<String> {
        let host = host_of(image);
        let mut args = self.auth_args();
        if self.insecure || self.sources.insecure.contains(&host) {
            args.push("--tls-verify=false".to_string());
        }
        if let Some(dir) = self.sources.cert_dirs.get(&host) {
            args.push(format!("--cert-dir={}", dir.display()));
        }
        args
    }

    /// skopeo's options for `skopeo copy` from `source` to `destination`.
    pub fn copy_args(&self, source: &str, destination: &str) -> Vec<String> {
        let mut args = self.auth_args();
        for (side, image) in [("src", source), ("dest", destination)] {
            let host = host_of(image);
            if self.insecure || self.sources.insecure.contains(&host) {
                args.push(format!("--{side}-tls-verify=false"));
            }
            if let Some(dir) = self.sources.cert_dirs.get(&host) {
                args.push(format!("--{side}-cert-dir={}", dir.display()));
            }
        }
        args
    }

    fn auth_args(&self) -> Vec<String> {
        match &self.logins {
            Some(logins) => vec![format!("--authfile={}", logins.path.display())],
            None => Vec::new(),
        }
    }

    /// Fetches the tokens of `hosts` that are due, and writes the merged auth file when it
    /// changed. A host whose fetch fails keeps a token that has not expired yet.
    async fn fresh(&self, hosts: &[String]) -> Result<(), String> {
        let Some(logins) = &self.logins else {
            return Ok(());
        };
        let mut state = logins.state.lock().await;
        let LoginState { tokens, written } = &mut *state;
        let now = SystemTime::now();
        for host in hosts {
            let due = tokens.get(host).is_none_or(|token| token.refresh <= now);
            if !due {
                continue;
            }
            let fetched = if let Some(ecr) = self.ecr.get(host) {
                ecr_token(ecr).await
            } else if logins.gar.contains(host) {
                gar_token(&logins.metadata, host).await
            } else {
                continue;
            };
            match fetched {
                Ok(token) => {
                    tracing::info!(%host, "logged in");
                    tokens.insert(host.clone(), token);
                }
                Err(error) => match tokens.get(host) {
                    Some(old) if old.expires > now => {
                        tracing::warn!(%host, %error, "cannot renew the login; the current one holds until it expires");
                    }
                    _ => return Err(error),
                },
            }
        }
        let user = match &logins.user_file {
            Some(path) => Some(read_user_file(path).map_err(|e| format!("{e:#}"))?),
            None => None,
        };
        let auths: BTreeMap<String, String> = tokens
            .iter()
            .map(|(host, token)| (host.clone(), token.auth.clone()))
            .collect();
        let bytes = serde_json::to_vec_pretty(&merge(user, &auths))
            .map_err(|e| format!("the merged auth file: {e}"))?;
        if written.as_deref() != Some(bytes.as_slice()) {
            write_private(&logins.path, &bytes)
                .map_err(|e| format!("cannot write {}: {e}", logins.path.display()))?;
            *written = Some(bytes);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[rstest::rstest]
    #[case::a_12_hour_token_is_renewed_after_6(12 * 3600, 6 * 3600)]
    #[case::a_metadata_token_at_half_its_life(3599, 1799)]
    #[case::an_expired_token_at_once(0, 0)]
    fn a_token_is_fetched_again_at_half_its_remaining_life(
        #[case] lifetime: u64,
        #[case] after: u64,
    ) {
        let now = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let at = refresh_at(now, now + Duration::from_secs(lifetime));
        assert_eq!(
            at.duration_since(now).map(|d| d.as_secs()).ok(),
            Some(after)
        );
    }

    #[test]
    fn a_token_that_expired_before_it_came_is_fetched_again_at_once() {
        let now = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        // moto answers with an expiresAt in 2015.
        let expired = UNIX_EPOCH + Duration::from_secs(1_420_070_400);
        assert_eq!(refresh_at(now, expired), now);
    }
}
