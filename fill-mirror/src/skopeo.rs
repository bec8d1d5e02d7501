//! The copy engine: skopeo as a subprocess, as a person would run the policy's copy
//! (`skopeo copy --all --preserve-digests`: every digest of a multi-platform index kept). A
//! destination that exists is never copied over: only a registry's "does not exist" lets a copy
//! run, since anything else could be a tag that exists, which a copy would move (a tag the source
//! moved gets its new digest copied beside it). A signature tag is the exception
//! (`attached.rs`): it follows its source.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use image_swapper_policy::plan::Copy;
use tokio::process::Command;

use crate::board::Outcome;
use crate::credentials::Access;
use crate::digest::digest_of;
use image_swapper_policy::reference::Reference;

/// The source's and the destination's repositories of a copy whose source names its image by
/// tag (no digest); `None` for any other copy.
fn by_tag(copy: &Copy) -> Option<(String, String)> {
    let source = Reference::parse(&copy.source).ok()?;
    let destination = Reference::parse(&copy.destination).ok()?;
    (source.digest().is_none() && source.tag().is_some())
        .then(|| (source.name().to_string(), destination.name().to_string()))
}

/// What registries answer for a manifest or a repository that does not exist (skopeo prints the
/// error's code, then the registry's message): distribution's "manifest unknown" and "name
/// unknown", ECR's "does not exist in the registry" and "Requested image not found", Artifact
/// Registry's `Failed to fetch "<tag>"` and `Repository "<name>" not found`.
const ABSENT_WORDS: [&str; 6] = [
    "manifest unknown",
    "name unknown",
    "repository name not known to registry",
    "does not exist in the registry",
    "requested image not found",
    "failed to fetch \"",
];

/// skopeo's words for a registry's 429 and 5xx answers (containers/image: "too many requests to
/// registry", "invalid status code from registry 503 (Service Unavailable)", "received
/// unexpected HTTP status: 502 Bad Gateway").
fn throttled(words: &str) -> bool {
    let words = words.to_ascii_lowercase();
    if words.contains("too many requests") || words.contains("toomanyrequests") {
        return true;
    }
    [
        "status code from registry ",
        "http status: ",
        "status code: ",
    ]
    .iter()
    .any(|lead| {
        words.match_indices(lead).any(|(at, _)| {
            let code = &words[at + lead.len()..];
            code.starts_with("429")
                || (code.starts_with('5')
                    && code.len() >= 3
                    && code[..3].bytes().all(|b| b.is_ascii_digit()))
        })
    })
}

/// Whether skopeo's `words` about `image` say the registry has no such image. Docker Hub's
/// registry answers the manifest of a repository that does not exist with 401, not 404: its
/// token service gives a token to anyone for any scope (docker/hub-feedback#1771), and the
/// registry then refuses that token with `UNAUTHORIZED` "authentication required",
/// `error="insufficient_scope"` (distribution's `errcode` `ErrorCodeUnauthorized`; Docker Hub's
/// answer as distribution#2624 quotes it), which skopeo prints as "denied: requested access to
/// the resource is denied / unauthorized: authentication required" and docker as "pull access
/// denied …, repository does not exist or may require 'docker login'". So for a `docker.io`
/// image that 401 is "gone". Bad credentials never get that far: the token service refuses
/// them first (401 "incorrect username or password"; skopeo: "unable to retrieve auth token:
/// invalid username/password"), so those words stay a failure. With good credentials of an
/// account that may not read a private repository the answer is the same 401: gone for us too.
fn absent(image: &str, words: &str) -> bool {
    let words = words.to_ascii_lowercase();
    ABSENT_WORDS.iter().any(|w| words.contains(w))
        || (words.contains("repository \"") && words.contains("\" not found"))
        || (docker_hub(image) && docker_hub_absent(&words))
}

/// Whether `image` is on Docker Hub (as the policy normalises it: `docker.io`, or its API and
/// index hosts named outright).
fn docker_hub(image: &str) -> bool {
    let host = match image_swapper_policy::reference::Reference::parse(image) {
        Ok(reference) => reference.domain().to_string(),
        Err(_) => image.split('/').next().unwrap_or_default().to_string(),
    };
    matches!(
        host.as_str(),
        "docker.io" | "index.docker.io" | "registry-1.docker.io"
    )
}

/// Docker Hub's 401 for a repository it does not have (or will not show these credentials):
/// the registry's `UNAUTHORIZED` on the repository, in skopeo's words. `words` in lower case.
/// The token service's refusal of bad credentials is not among them (skopeo: "unable to
/// retrieve auth token: invalid username/password: unauthorized: incorrect username or
/// password": "unauthorized" alone is not enough), so it stays a failure.
fn docker_hub_absent(words: &str) -> bool {
    words.contains("requested access to the resource is denied")
        || words.contains("insufficient_scope")
        || (words.contains("unauthorized") && words.contains("authentication required"))
}

/// The last line of skopeo's words, for a log line.
fn last_line(words: &str) -> String {
    words
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("skopeo said nothing")
        .to_string()
}

#[derive(Clone, Debug)]
pub struct Skopeo {
    pub binary: String,
    /// Credentials and TLS per registry (`--insecure`, `--auth-file`, sources.yaml, tokens).
    pub access: Arc<Access>,
    /// How long one skopeo run may take.
    pub timeout: Duration,
    /// The source host whose login this copy may not use (`--source-namespaces`): read with
    /// `--no-creds`, anonymously.
    pub anonymous_at: Option<String>,
}

/// Whether an image exists.
#[derive(Debug, PartialEq, Eq)]
enum Presence {
    Exists,
    Absent,
    /// Could not tell: the words.
    Unknown(String),
}

impl Skopeo {
    /// This engine, reading `host` anonymously (a copy whose requesters may not use its login).
    pub fn anonymous_at(&self, host: Option<String>) -> Skopeo {
        Skopeo {
            anonymous_at: host,
            ..self.clone()
        }
    }

    /// The source host a copy reads anonymously: none of the namespaces that ask for it now
    /// (`requesters`) is listed for its login (`--source-namespaces`).
    pub fn anonymous_for(&self, copy: &Copy, requesters: &BTreeSet<String>) -> Option<String> {
        let host = crate::credentials::host_of(&copy.source);
        (!self.access.source_login_for(&host, requesters)).then_some(host)
    }

    fn anonymous(&self, image: &str) -> bool {
        self.anonymous_at
            .as_deref()
            .is_some_and(|host| crate::credentials::host_of(image) == host)
    }

    /// skopeo's standard output when it succeeds, its standard error when not.
    async fn run(&self, args: &[String]) -> Result<Vec<u8>, String> {
        let mut command = Command::new(&self.binary);
        command.args(args).kill_on_drop(true);
        let output = match tokio::time::timeout(self.timeout, command.output()).await {
            Err(_) => return Err(format!("skopeo took longer than {:?}", self.timeout)),
            Ok(Err(error)) => return Err(format!("cannot run {}: {error}", self.binary)),
            Ok(Ok(output)) => output,
        };
        if output.status.success() {
            Ok(output.stdout)
        } else {
            Err(String::from_utf8_lossy(&output.stderr).into_owned())
        }
    }

    async fn inspect(&self, image: &str) -> Presence {
        match self.manifest(image).await {
            Ok(Some(_)) => Presence::Exists,
            Ok(None) => Presence::Absent,
            Err(words) => Presence::Unknown(words),
        }
    }

    /// The manifest `image` names, exactly as the registry serves it (its digest is the
    /// sha256 of these bytes); `None` when the registry says there is none; the words when it
    /// cannot tell.
    pub async fn manifest(&self, image: &str) -> Result<Option<Vec<u8>>, String> {
        let mut args = vec!["inspect".to_string(), "--raw".to_string()];
        args.extend(self.access.inspect_args(image));
        if self.anonymous(image) {
            args.push("--no-creds".to_string());
        }
        args.push(format!("docker://{image}"));
        match self.run(&args).await {
            Ok(bytes) => Ok(Some(bytes)),
            Err(words) if absent(image, &words) => Ok(None),
            Err(words) => Err(last_line(&words)),
        }
    }

    /// Copies `source` to `destination` whatever the destination holds: for what follows its
    /// source (a signature tag) or cannot differ (a reference by digest).
    pub async fn copy_over(&self, source: &str, destination: &str) -> Outcome {
        if let Err(error) = self.access.prepare(source, destination).await {
            return Outcome::Failed(error);
        }
        // `--ecr-create-repositories`: no repository for a source that is gone or cannot be
        // read, so the source answers first.
        if self.access.creates_repository(destination) {
            match self.inspect(source).await {
                Presence::Exists => {}
                Presence::Absent => {
                    return Outcome::Gone(format!("the source has no {source}"));
                }
                Presence::Unknown(words) => {
                    return Outcome::Failed(format!(
                        "could not tell whether docker://{source} exists: {}",
                        last_line(&words)
                    ));
                }
            }
            if let Err(error) = self.access.make_repository(destination).await {
                return Outcome::Failed(error);
            }
        }
        let mut args = vec![
            "copy".to_string(),
            "--all".to_string(),
            "--preserve-digests".to_string(),
        ];
        args.extend(self.access.copy_args(source, destination));
        if self.anonymous(source) {
            args.push("--src-no-creds".to_string());
        }
        args.push(format!("docker://{source}"));
        args.push(format!("docker://{destination}"));
        match self.run(&args).await {
            Ok(_) => Outcome::Copied,
            Err(words) if throttled(&words) => Outcome::Throttled(last_line(&words), None),
            Err(words) => match self.inspect(source).await {
                Presence::Absent => Outcome::Gone(last_line(&words)),
                _ if self.anonymous(source) => Outcome::Failed(format!(
                    "{} (read anonymously: no namespace that asks for it is listed for the login of its host in --source-namespaces)",
                    last_line(&words)
                )),
                _ => Outcome::Failed(last_line(&words)),
            },
        }
    }

    /// Makes one copy unless its destination exists: then [`Skopeo::moved_tag`].
    pub async fn copy(&self, copy: &Copy) -> Outcome {
        if let Err(error) = self.access.prepare(&copy.source, &copy.destination).await {
            return Outcome::Failed(error);
        }
        match self.manifest(&copy.destination).await {
            Ok(Some(held)) => return self.moved_tag(copy, &held).await,
            Ok(None) => {}
            Err(words) => {
                return Outcome::Failed(format!(
                    "could not tell whether docker://{} exists: {words}",
                    copy.destination
                ));
            }
        }
        self.copy_over(&copy.source, &copy.destination).await
    }

    /// The destination's tag exists (`held`): `Present`, unless the copy is by tag and the
    /// source's tag now names another digest (the source moved it). The policy asked for the
    /// copy because it wants that digest (a covered image is verified at its source, and only
    /// that digest's copy is swapped to), so counting it `Present` would leave every next Pod
    /// at its source. The image tag is still never moved: the source's digest is copied beside
    /// it, under the digest's own tag `sha256-<hex>` (as a pinned image is copied), which the
    /// policy finds by digest and swaps to as `<tag>@<digest>`.
    async fn moved_tag(&self, copy: &Copy, held: &[u8]) -> Outcome {
        let Some((source_repository, destination_repository)) = by_tag(copy) else {
            return Outcome::Present;
        };
        let now = match self.manifest(&copy.source).await {
            Ok(Some(now)) => digest_of(&now),
            // Gone at the source: the mirror's copy is all there is.
            Ok(None) => return Outcome::Present,
            Err(words) => {
                return Outcome::Failed(format!(
                    "could not tell whether the source's tag docker://{} still names what the mirror holds: {words}",
                    copy.source
                ));
            }
        };
        let mirror_has = digest_of(held);
        if now == mirror_has {
            return Outcome::Present;
        }
        let beside = format!("{destination_repository}:{}", now.replacen(':', "-", 1));
        tracing::warn!(source = %copy.source, destination = %copy.destination, mirror = %mirror_has, %now, copied_to = %beside, "the source moved its tag: the mirror's tag is not moved, the digest the source names now is copied beside it under its own tag");
        match self.manifest(&beside).await {
            Ok(Some(_)) => Outcome::Present,
            Ok(None) => {
                self.copy_over(&format!("{source_repository}@{now}"), &beside)
                    .await
            }
            Err(words) => Outcome::Failed(format!(
                "could not tell whether docker://{beside} exists: {words}"
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[rstest::rstest]
    #[case(
        "reading manifest 1 in docker.io/x: toomanyrequests: You have reached your pull rate limit",
        true
    )]
    #[case("invalid status code from registry 503 (Service Unavailable)", true)]
    #[case("received unexpected HTTP status: 502 Bad Gateway", true)]
    #[case("invalid status code from registry 404 (Not Found)", false)]
    #[case("unauthorized: authentication required", false)]
    fn throttling_is_told_from_skopeo_s_words(#[case] words: &str, #[case] expected: bool) {
        assert_eq!(throttled(words), expected);
    }

    #[rstest::rstest]
    #[case(
        "reading manifest 1 in 127.0.0.1:5000/x: manifest unknown: manifest unknown",
        true
    )]
    #[case("Repository \"hub\" not found", true)]
    #[case("unauthorized: authentication required", false)]
    #[case("dial tcp 127.0.0.1:1: connect: connection refused", false)]
    fn absence_is_told_from_skopeo_s_words(#[case] words: &str, #[case] expected: bool) {
        assert_eq!(absent("127.0.0.1:5000/x:1", words), expected);
    }

    /// skopeo 1.9's words for Docker Hub's answers (the rig's stand-in, tests/docker_hub.rs).
    const HUB_MISSING: &str = "reading manifest 1 in docker.io/library/typo: errors:\ndenied: requested access to the resource is denied\nunauthorized: authentication required\n";
    const HUB_BAD_LOGIN: &str = "unable to retrieve auth token: invalid username/password: unauthorized: incorrect username or password";

    #[rstest::rstest]
    #[case::a_typo_on_docker_hub("docker.io/library/typo:1", HUB_MISSING, true)]
    #[case::short_name_on_docker_hub("typo:1", HUB_MISSING, true)]
    #[case::its_api_host("registry-1.docker.io/library/typo:1", HUB_MISSING, true)]
    #[case::bad_credentials_on_docker_hub("docker.io/library/typo:1", HUB_BAD_LOGIN, false)]
    #[case::the_same_401_elsewhere("quay.io/team/typo:1", HUB_MISSING, false)]
    #[case::a_private_registry_s_401(
        "registry.example/typo:1",
        "unauthorized: authentication required",
        false
    )]
    fn docker_hub_s_401_for_a_missing_repository_is_absence(
        #[case] image: &str,
        #[case] words: &str,
        #[case] expected: bool,
    ) {
        assert_eq!(absent(image, words), expected);
    }
}
