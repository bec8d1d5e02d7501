//! Who the binary is at each registry, and how it reaches each registry's TLS: the docker config
//! a Secret mounts, merged with the tokens the binary gets by itself (ECR's from its AWS
//! identity, Artifact Registry's from the GKE metadata server) into the one auth file skopeo
//! reads; ECR repositories made before a copy when asked to; and Kubewarden's `sources.yaml`
//! (insecure hosts, private CAs) read as policy-server reads it. Kept apart from the copy engine
//! so that `skopeo.rs` only turns these into arguments.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use aws_sdk_ecr::error::DisplayErrorContext;
use base64::Engine;
use image_swapper_policy::reference::Reference;
use serde::Deserialize;
use serde_json::{Value, json};

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
    /// The tag mutability of the repositories --ecr-create-repositories creates.
    #[arg(long, default_value = "IMMUTABLE", value_parser = ["IMMUTABLE", "MUTABLE"])]
    pub ecr_image_tag_mutability: String,
    /// An Artifact Registry host (e.g. europe-docker.pkg.dev) whose access token the binary
    /// gets from the GKE metadata server (Workload Identity). Repeatable.
    #[arg(long = "gar-registry")]
    pub gar_registries: Vec<String>,
    /// Kubewarden's sources.yaml (insecure_sources, source_authorities), the file policy-server
    /// reads with the same flag.
    #[arg(long, env = "KUBEWARDEN_SOURCES_PATH")]
    pub sources_path: Option<PathBuf>,
}

/// How long a token whose answer gave no expiry is taken to last (ECR's documented 12 hours).
const ECR_LIFETIME: Duration = Duration::from_secs(12 * 3600);
/// The GKE metadata server, unless `GCE_METADATA_HOST` names another (as Google's libraries
/// read it: a host and port, no scheme).
const METADATA_HOST: &str = "metadata.google.internal";
const METADATA_TOKEN_PATH: &str = "/computeMetadata/v1/instance/service-accounts/default/token";
/// Artifact Registry's user name for an OAuth access token.
const GAR_USER: &str = "oauth2accesstoken";

/// When a token that expires at `expires` (got at `now`) is fetched again: at half its
/// remaining life, so a 12-hour ECR token is renewed after 6 hours and a failed renewal has
/// hours to succeed; at once when it has expired already.
pub fn refresh_at(now: SystemTime, expires: SystemTime) -> SystemTime {
    match expires.duration_since(now) {
        Ok(left) if !left.is_zero() => now + left / 2,
        _ => now,
    }
}

/// The account and region of an ECR registry host
/// (`<account>.dkr.ecr[-fips].<region>.amazonaws.com[.cn]`); None for any other host.
pub fn ecr_host(host: &str) -> Option<(&str, &str)> {
    let parts: Vec<&str> = host.split('.').collect();
    let account = *parts.first()?;
    let well_formed = parts.len() >= 6
        && account.len() == 12
        && account.bytes().all(|b| b.is_ascii_digit())
        && parts[1] == "dkr"
        && (parts[2] == "ecr" || parts[2] == "ecr-fips")
        && matches!(
            &parts[4..],
            ["amazonaws", "com"] | ["amazonaws", "com", "cn"]
        );
    well_formed.then(|| (account, parts[3]))
}

/// The registry host an image names (its domain as the policy normalises it), or its text
/// before the first `/` when it does not parse.
fn host_of(image: &str) -> String {
    match Reference::parse(image) {
        Ok(reference) => reference.domain().to_string(),
        Err(_) => image.split('/').next().unwrap_or_default().to_string(),
    }
}

/// Kubewarden's sources.yaml, as policy-fetcher's `src/sources.rs` reads it: every key optional,
/// YAML or JSON; an authority is `{type: Data, data: PEM}` or `{type: Path, path: FILE}`.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct RawSources {
    insecure_sources: Vec<String>,
    source_authorities: BTreeMap<String, Vec<RawAuthority>>,
}

#[derive(Debug, Deserialize)]
#[serde(tag = "type")]
enum RawAuthority {
    Data { data: String },
    Path { path: PathBuf },
}

/// A certificate as PEM: PEM text as it is, DER (a `.der` file) wrapped.
fn as_pem(bytes: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(bytes);
    if text.contains("-----BEGIN CERTIFICATE-----") {
        return Some(text.into_owned());
    }
    // DER: an ASN.1 SEQUENCE.
    if bytes.first() != Some(&0x30) {
        return None;
    }
    let encoded = base64::engine::general_purpose::STANDARD.encode(bytes);
    let lines: Vec<&str> = encoded
        .as_bytes()
        .chunks(64)
        .filter_map(|line| std::str::from_utf8(line).ok())
        .collect();
    Some(format!(
        "-----BEGIN CERTIFICATE-----\n{}\n-----END CERTIFICATE-----\n",
        lines.join("\n")
    ))
}

/// A host as sources.yaml names it, fit to be a folder's name.
fn valid_host(host: &str) -> bool {
    !host.is_empty()
        && !host.starts_with('.')
        && !host.contains('/')
        && !host.contains('\\')
        && !host.chars().any(char::is_whitespace)
}

/// The TLS of each registry: sources.yaml's insecure hosts, and a certs folder per host that
/// has authorities (skopeo's `--cert-dir` layout: `<host>/ca.crt`).
#[derive(Debug, Default)]
pub struct Sources {
    insecure: BTreeSet<String>,
    cert_dirs: BTreeMap<String, PathBuf>,
}

impl Sources {
    /// Reads `path` and writes each host's authorities under `certs`.
    pub fn load(path: &Path, certs: &Path) -> anyhow::Result<Sources> {
        let flag = format!("--sources-path {}", path.display());
        let text = std::fs::read_to_string(path).with_context(|| flag.clone())?;
        let raw: RawSources = if text.trim().is_empty() {
            RawSources::default()
        } else {
            serde_yaml::from_str(&text).with_context(|| {
                format!(
                    "{flag}: not Kubewarden's sources.yaml (insecure_sources, source_authorities)"
                )
            })?
        };
        let mut sources = Sources::default();
        for host in raw.insecure_sources {
            anyhow::ensure!(
                valid_host(&host),
                "{flag}: insecure_sources: {host:?} is not a registry host[:port]"
            );
            sources.insecure.insert(host);
        }
        for (host, authorities) in raw.source_authorities {
            anyhow::ensure!(
                valid_host(&host),
                "{flag}: source_authorities: {host:?} is not a registry host[:port]"
            );
            let mut bundle = String::new();
            for (index, authority) in authorities.into_iter().enumerate() {
                let (bytes, what) = match authority {
                    RawAuthority::Data { data } => (data.into_bytes(), "its data".to_string()),
                    RawAuthority::Path { path } => {
                        let bytes = std::fs::read(&path).with_context(|| {
                            format!(
                                "{flag}: source_authorities: {host} [{index}]: {}",
                                path.display()
                            )
                        })?;
                        (bytes, path.display().to_string())
                    }
                };
                let pem = as_pem(&bytes).with_context(|| {
                    format!(
                        "{flag}: source_authorities: {host} [{index}]: {what} is not a PEM or DER certificate"
                    )
                })?;
                bundle.push_str(pem.trim_end());
                bundle.push('\n');
            }
            let dir = certs.join(&host);
            std::fs::create_dir_all(&dir).with_context(|| format!("{}", dir.display()))?;
            std::fs::write(dir.join("ca.crt"), bundle)
                .with_context(|| format!("{}/ca.crt", dir.display()))?;
            sources.cert_dirs.insert(host, dir);
        }
        Ok(sources)
    }
}

/// The docker config skopeo reads: the user's file as it is, each host the binary logs in to
/// itself replaced by its own login.
pub fn merge(user: Option<Value>, logins: &BTreeMap<String, String>) -> Value {
    let mut config = match user {
        Some(Value::Object(map)) => Value::Object(map),
        _ => json!({}),
    };
    if !config.get("auths").is_some_and(Value::is_object) {
        config["auths"] = json!({});
    }
    for (host, auth) in logins {
        config["auths"][host] = json!({ "auth": auth });
    }
    config
}

/// A token and when to fetch it again.
#[derive(Clone, Debug)]
struct Token {
    /// base64 of `user:password`, a docker config's `auth`.
    auth: String,
    refresh: SystemTime,
    expires: SystemTime,
}

/// One `--ecr-registry`.
struct Ecr {
    host: String,
    /// The account the host names, for the repositories' `registryId`; None for a host that is
    /// not ECR's form (a test's loopback registry): the caller's own account.
    registry_id: Option<String>,
    client: aws_sdk_ecr::Client,
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

/// A folder only this user can read, under the temporary folder (an emptyDir in the Pod: the
/// root file system is read-only).
fn private_folder() -> anyhow::Result<PathBuf> {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or_default();
    let folder = std::env::temp_dir().join(format!("fill-mirror-{}-{nanos}", std::process::id()));
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&folder)
        .with_context(|| format!("cannot make the private folder {}", folder.display()))?;
    Ok(folder)
}

impl Access {
    pub async fn new(args: &AccessArgs, insecure: bool) -> anyhow::Result<Access> {
        let folder = private_folder()?;
        let mut access = Access {
            insecure,
            sources: Sources::default(),
            logins: None,
            ecr: BTreeMap::new(),
            create: None,
            known: Mutex::new(HashSet::new()),
            folder: folder.clone(),
        };
        if let Some(path) = &args.sources_path {
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
                read_user_file(user_file)?;
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

    /// Before a copy: the logins of its two hosts fresh in the auth file, and with
    /// `--ecr-create-repositories`, its ECR repository made.
    pub async fn prepare(&self, source: &str, destination: &str) -> Result<(), String> {
        self.fresh(&[host_of(source), host_of(destination)]).await?;
        if let Some(mutability) = &self.create {
            self.repository(destination, mutability).await?;
        }
        Ok(())
    }

    /// Whether `host` is asked over plain HTTP (or unverified TLS): `--insecure`, or named in
    /// sources.yaml's `insecure_sources`.
    pub fn plain_http(&self, host: &str) -> bool {
        self.insecure || self.sources.insecure.contains(host)
    }

    /// The CA bundles sources.yaml's `source_authorities` gave, one file per host.
    pub fn authorities(&self) -> Vec<PathBuf> {
        self.sources
            .cert_dirs
            .values()
            .map(|dir| dir.join("ca.crt"))
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

    /// With `--ecr-create-repositories`: the repository of `destination` made when its host is
    /// an `--ecr-registry` and ECR says it does not exist. One that another copier made in the
    /// meantime is as good.
    async fn repository(&self, destination: &str, mutability: &str) -> Result<(), String> {
        let Ok(reference) = Reference::parse(destination) else {
            return Ok(());
        };
        let Some(ecr) = self.ecr.get(reference.domain()) else {
            return Ok(());
        };
        let name = reference.path().to_string();
        let key = (ecr.host.clone(), name.clone());
        if self.known.lock().is_ok_and(|known| known.contains(&key)) {
            return Ok(());
        }
        let described = ecr
            .client
            .describe_repositories()
            .set_registry_id(ecr.registry_id.clone())
            .repository_names(&name)
            .send()
            .await;
        match described {
            Ok(_) => {}
            Err(error)
                if error
                    .as_service_error()
                    .is_some_and(|e| e.is_repository_not_found_exception()) =>
            {
                let created = ecr
                    .client
                    .create_repository()
                    .set_registry_id(ecr.registry_id.clone())
                    .repository_name(&name)
                    .image_tag_mutability(aws_sdk_ecr::types::ImageTagMutability::from(mutability))
                    .image_scanning_configuration(
                        aws_sdk_ecr::types::ImageScanningConfiguration::builder()
                            .scan_on_push(true)
                            .build(),
                    )
                    .send()
                    .await;
                match created {
                    Ok(_) => {
                        tracing::info!(host = %ecr.host, repository = %name, "created ECR repository {name}");
                    }
                    Err(error)
                        if error
                            .as_service_error()
                            .is_some_and(|e| e.is_repository_already_exists_exception()) => {}
                    Err(error) => {
                        return Err(format!(
                            "--ecr-create-repositories: cannot create the repository {name} in {}: CreateRepository: {}",
                            ecr.host,
                            DisplayErrorContext(&error)
                        ));
                    }
                }
            }
            Err(error) => {
                return Err(format!(
                    "--ecr-create-repositories: cannot tell whether the repository {name} exists in {}: DescribeRepositories: {}",
                    ecr.host,
                    DisplayErrorContext(&error)
                ));
            }
        }
        if let Ok(mut known) = self.known.lock() {
            known.insert(key);
        }
        Ok(())
    }
}

/// The user's docker config, as JSON.
fn read_user_file(path: &Path) -> anyhow::Result<Value> {
    let flag = format!("--auth-file {}", path.display());
    let text = std::fs::read_to_string(path).with_context(|| flag.clone())?;
    let value: Value =
        serde_json::from_str(&text).with_context(|| format!("{flag}: not a docker config JSON"))?;
    anyhow::ensure!(
        value.is_object(),
        "{flag}: not a docker config JSON (an object with \"auths\")"
    );
    Ok(value)
}

/// Writes `bytes` to `path` as a new file only its owner reads (0600), then renames it over
/// `path`: skopeo never reads half a file.
fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let next = path.with_extension("json.next");
    let _ = std::fs::remove_file(&next);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&next)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    std::fs::rename(&next, path)
}

/// One ECR client per `--ecr-registry`, on the AWS SDK's default credential chain (env, web
/// identity for IRSA, the container endpoint for EKS Pod Identity), each in its host's region
/// (or the chain's, `AWS_REGION`, for a host not of ECR's form). The endpoint follows the SDK's
/// own `AWS_ENDPOINT_URL` / `AWS_ENDPOINT_URL_ECR`. HTTPS is rustls with ring.
async fn ecr_clients(hosts: &[String]) -> anyhow::Result<BTreeMap<String, Ecr>> {
    use aws_smithy_http_client::tls::{Provider, rustls_provider::CryptoMode};
    let http = aws_smithy_http_client::Builder::new()
        .tls_provider(Provider::Rustls(CryptoMode::Ring))
        .build_https();
    let shared = aws_config::defaults(aws_config::BehaviorVersion::latest())
        .http_client(http)
        .load()
        .await;
    let mut clients = BTreeMap::new();
    for host in hosts {
        let host = host.trim();
        anyhow::ensure!(
            valid_host(host),
            "--ecr-registry {host:?}: not a registry host (<account>.dkr.ecr.<region>.amazonaws.com)"
        );
        let mut config = aws_sdk_ecr::config::Builder::from(&shared);
        let parsed = ecr_host(host);
        if let Some((_, region)) = parsed {
            config = config.region(aws_sdk_ecr::config::Region::new(region.to_string()));
        }
        clients.insert(
            host.to_string(),
            Ecr {
                host: host.to_string(),
                registry_id: parsed.map(|(account, _)| account.to_string()),
                client: aws_sdk_ecr::Client::from_conf(config.build()),
            },
        );
    }
    Ok(clients)
}

/// ECR's push token for `ecr.host`: GetAuthorizationToken, whose token is already a docker
/// config's `auth` (base64 of `AWS:<password>`). It serves every registry the identity may use
/// (ECR has deprecated `registryIds`), in the client's region.
async fn ecr_token(ecr: &Ecr) -> Result<Token, String> {
    let failed =
        |what: String| format!("--ecr-registry {}: GetAuthorizationToken: {what}", ecr.host);
    let answer = ecr
        .client
        .get_authorization_token()
        .send()
        .await
        .map_err(|error| failed(DisplayErrorContext(&error).to_string()))?;
    let data = answer
        .authorization_data()
        .first()
        .ok_or_else(|| failed("no authorizationData in the answer".to_string()))?;
    let auth = data
        .authorization_token()
        .ok_or_else(|| failed("no authorizationToken in the answer".to_string()))?;
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(auth)
        .ok()
        .and_then(|bytes| String::from_utf8(bytes).ok());
    if !decoded.is_some_and(|text| text.contains(':')) {
        return Err(failed(
            "the authorizationToken is not base64 of user:password".to_string(),
        ));
    }
    let now = SystemTime::now();
    let expires = data
        .expires_at()
        .map(|at| UNIX_EPOCH + Duration::from_secs(u64::try_from(at.secs()).unwrap_or(0)))
        .unwrap_or(now + ECR_LIFETIME);
    Ok(Token {
        auth: auth.to_string(),
        refresh: refresh_at(now, expires),
        expires,
    })
}

/// The metadata server's answer (`expires_in` in seconds).
#[derive(Deserialize)]
struct MetadataToken {
    access_token: String,
    expires_in: u64,
}

/// An access token of the node's (the Pod's, with Workload Identity) service account from the
/// metadata server at `base`, as Artifact Registry's password for `oauth2accesstoken`.
async fn gar_token(base: &str, host: &str) -> Result<Token, String> {
    use http_body_util::BodyExt;
    let url = format!("{base}{METADATA_TOKEN_PATH}");
    let failed = |what: String| format!("--gar-registry {host}: the metadata server {url}: {what}");
    let request = http::Request::get(&url)
        .header("Metadata-Flavor", "Google")
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .map_err(|e| failed(e.to_string()))?;
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http();
    let answer = tokio::time::timeout(Duration::from_secs(10), async {
        let response = client.request(request).await.map_err(|e| e.to_string())?;
        let status = response.status();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        Ok::<_, String>((status, body))
    })
    .await
    .map_err(|_| failed("no answer within 10 s".to_string()))?
    .map_err(failed)?;
    let (status, body) = answer;
    if !status.is_success() {
        return Err(failed(format!(
            "HTTP {status}: {}",
            String::from_utf8_lossy(&body).trim()
        )));
    }
    let token: MetadataToken =
        serde_json::from_slice(&body).map_err(|e| failed(format!("not a token answer ({e})")))?;
    let now = SystemTime::now();
    let expires = now + Duration::from_secs(token.expires_in);
    let auth = base64::engine::general_purpose::STANDARD
        .encode(format!("{GAR_USER}:{}", token.access_token));
    Ok(Token {
        auth,
        refresh: refresh_at(now, expires),
        expires,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[rstest::rstest]
    #[case::ecr(
        "123456789012.dkr.ecr.eu-west-1.amazonaws.com",
        Some(("123456789012", "eu-west-1"))
    )]
    #[case::fips(
        "123456789012.dkr.ecr-fips.us-east-1.amazonaws.com",
        Some(("123456789012", "us-east-1"))
    )]
    #[case::china(
        "123456789012.dkr.ecr.cn-north-1.amazonaws.com.cn",
        Some(("123456789012", "cn-north-1"))
    )]
    #[case::short_account("12345.dkr.ecr.eu-west-1.amazonaws.com", None)]
    #[case::public("public.ecr.aws", None)]
    #[case::loopback("127.0.0.1:5000", None)]
    #[case::lookalike("123456789012.dkr.ecr.eu-west-1.amazonaws.com.evil.example", None)]
    fn an_ecr_host_names_its_account_and_region(
        #[case] host: &str,
        #[case] expected: Option<(&str, &str)>,
    ) {
        assert_eq!(ecr_host(host), expected);
    }

    #[test]
    fn the_merged_config_keeps_the_user_s_entries_and_replaces_the_binary_s_hosts() {
        let user = json!({
            "auths": {
                "quay.io": {"auth": "cm9ib3Q6cXVheQ=="},
                "1.dkr.example": {"auth": "b2xkOm9sZA=="}
            },
            "credHelpers": {"gcr.io": "gcloud"}
        });
        let logins = BTreeMap::from([("1.dkr.example".to_string(), "QVdTOm5ldw==".to_string())]);
        let merged = merge(Some(user), &logins);
        assert_eq!(
            merged,
            json!({
                "auths": {
                    "quay.io": {"auth": "cm9ib3Q6cXVheQ=="},
                    "1.dkr.example": {"auth": "QVdTOm5ldw=="}
                },
                "credHelpers": {"gcr.io": "gcloud"}
            })
        );
        assert_eq!(
            merge(None, &logins),
            json!({"auths": {"1.dkr.example": {"auth": "QVdTOm5ldw=="}}})
        );
    }

    #[test]
    fn sources_yaml_in_kubewarden_s_form_gives_insecure_hosts_and_a_ca_folder_per_host() {
        let dir = tempfile::tempdir().expect("dir");
        let der = [0x30u8, 0x03, 0x02, 0x01, 0x01];
        std::fs::write(dir.path().join("ca.der"), der).expect("der");
        let yaml = format!(
            "insecure_sources:\n  - \"dev.example:5000\"\nsource_authorities:\n  \"pre.example\":\n    - type: Data\n      data: |\n        -----BEGIN CERTIFICATE-----\n        AAAA\n        -----END CERTIFICATE-----\n    - type: Path\n      path: {}\n",
            dir.path().join("ca.der").display()
        );
        let path = dir.path().join("sources.yaml");
        std::fs::write(&path, yaml).expect("yaml");
        let sources = Sources::load(&path, &dir.path().join("certs")).expect("sources");
        assert!(sources.insecure.contains("dev.example:5000"));
        let bundle =
            std::fs::read_to_string(dir.path().join("certs/pre.example/ca.crt")).expect("ca.crt");
        assert_eq!(
            bundle.matches("-----BEGIN CERTIFICATE-----").count(),
            2,
            "{bundle}"
        );
        assert!(bundle.contains("MAMCAQE="), "the DER file as PEM: {bundle}");
    }

    #[rstest::rstest]
    #[case::not_a_certificate(
        "source_authorities:\n  pre.example:\n    - type: Data\n      data: hello\n",
        "source_authorities: pre.example [0]: its data is not a PEM or DER certificate"
    )]
    #[case::a_path_for_a_host(
        "insecure_sources: [\"../etc\"]\n",
        "insecure_sources: \"../etc\" is not a registry host[:port]"
    )]
    #[case::another_form("insecure_sources: {a: b}\n", "not Kubewarden's sources.yaml")]
    fn a_bad_sources_yaml_is_refused_naming_the_entry(#[case] yaml: &str, #[case] words: &str) {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("sources.yaml");
        std::fs::write(&path, yaml).expect("yaml");
        let error = Sources::load(&path, &dir.path().join("certs")).expect_err("refused");
        let text = format!("{error:#}");
        assert!(text.contains(words), "{text}");
        assert!(text.contains("--sources-path"), "{text}");
    }
}
