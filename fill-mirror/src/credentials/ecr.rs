//! ECR: the push token from the binary's own AWS identity, and with
//! `--ecr-create-repositories` the repository made before a copy (its tags immutable but the
//! signature tags, which follow their source).

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aws_sdk_ecr::error::DisplayErrorContext;
use aws_sdk_ecr::types::{
    ImageTagMutability, ImageTagMutabilityExclusionFilter, ImageTagMutabilityExclusionFilterType,
};
use base64::Engine;
use image_swapper_policy::reference::Reference;

use super::sources::valid_host;
use super::{Access, Token, refresh_at};

/// How long a token whose answer gave no expiry is taken to last (ECR's documented 12 hours).
const ECR_LIFETIME: Duration = Duration::from_secs(12 * 3600);

/// The tags exempt from immutability in an `IMMUTABLE_WITH_EXCLUSION` repository (an ECR
/// wildcard filter): cosign's `sha256-<hex>.sig`, `.att` and `.sbom`, which follow their source
/// (attached.rs), so that a re-signed image's new signature is copied over. The image tags the
/// binary writes it never moves, and they stay immutable.
/// Three filters, not `sha256-*`: a pinned digest restored under its own tag (`sha256-<hex>`)
/// names that digest for ever, and stays immutable.
pub const SIGNATURE_TAGS: [&str; 3] = ["sha256-*.sig", "sha256-*.att", "sha256-*.sbom"];

/// A repository's tag mutability and its exclusion filters, as CreateRepository takes them.
type Mutability = (
    ImageTagMutability,
    Option<Vec<ImageTagMutabilityExclusionFilter>>,
);

/// The tag mutability `--ecr-create-repositories` gives, and its exclusion filters: the
/// signature tags for `IMMUTABLE_WITH_EXCLUSION`, none otherwise.
fn mutability_of(mutability: &str) -> Result<Mutability, String> {
    let mutability = ImageTagMutability::from(mutability);
    if mutability != ImageTagMutability::ImmutableWithExclusion {
        return Ok((mutability, None));
    }
    let signatures = SIGNATURE_TAGS
        .iter()
        .map(|tags| {
            ImageTagMutabilityExclusionFilter::builder()
                .filter_type(ImageTagMutabilityExclusionFilterType::Wildcard)
                .filter(*tags)
                .build()
                .map_err(|error| format!("the exclusion filter {tags:?}: {error}"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok((mutability, Some(signatures)))
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

/// One `--ecr-registry`.
pub(super) struct Ecr {
    pub(super) host: String,
    /// The account the host names, for the repositories' `registryId`; None for a host that is
    /// not ECR's form (a test's loopback registry): the caller's own account.
    pub(super) registry_id: Option<String>,
    pub(super) client: aws_sdk_ecr::Client,
}

impl Access {
    /// The `--ecr-registry` host and the repository of `destination`, when it is on one.
    pub(super) fn repository_key(&self, destination: &str) -> Option<(String, String)> {
        let reference = Reference::parse(destination).ok()?;
        let ecr = self.ecr.get(reference.domain())?;
        Some((ecr.host.clone(), reference.path().to_string()))
    }

    /// With `--ecr-create-repositories`: the repository of `destination` made when its host is
    /// an `--ecr-registry` and ECR says it does not exist. One that another copier made in the
    /// meantime is as good.
    pub(super) async fn repository(
        &self,
        destination: &str,
        mutability: &str,
    ) -> Result<(), String> {
        let Some(key) = self.repository_key(destination) else {
            return Ok(());
        };
        let Some(ecr) = self.ecr.get(&key.0) else {
            return Ok(());
        };
        let name = key.1.clone();
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
                let (mutability, exclusions) = mutability_of(mutability).map_err(|error| {
                    format!("--ecr-create-repositories: the repository {name}: {error}")
                })?;
                let created = ecr
                    .client
                    .create_repository()
                    .set_registry_id(ecr.registry_id.clone())
                    .repository_name(&name)
                    .image_tag_mutability(mutability)
                    .set_image_tag_mutability_exclusion_filters(exclusions)
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

/// One ECR client per `--ecr-registry`, on the AWS SDK's default credential chain (env, web
/// identity for IRSA, the container endpoint for EKS Pod Identity), each in its host's region
/// (or the chain's, `AWS_REGION`, for a host not of ECR's form). The endpoint follows the SDK's
/// own `AWS_ENDPOINT_URL` / `AWS_ENDPOINT_URL_ECR`. HTTPS is rustls with ring.
pub(super) async fn ecr_clients(hosts: &[String]) -> anyhow::Result<BTreeMap<String, Ecr>> {
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
pub(super) async fn ecr_token(ecr: &Ecr) -> Result<Token, String> {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Only `IMMUTABLE_WITH_EXCLUSION` carries an exclusion filter (ECR refuses one with any
    /// other mutability), and it is the signature tags' wildcard.
    #[rstest::rstest]
    #[case::with_exclusion("IMMUTABLE_WITH_EXCLUSION", Some(SIGNATURE_TAGS.as_slice()))]
    #[case::immutable("IMMUTABLE", None)]
    #[case::mutable("MUTABLE", None)]
    fn the_signature_tags_are_excluded_only_with_exclusion(
        #[case] mutability: &str,
        #[case] excluded: Option<&[&str]>,
    ) {
        let (given, filters) = mutability_of(mutability).expect("valid");
        assert_eq!(given.as_str(), mutability);
        let filters: Option<Vec<(String, String)>> = filters.map(|filters| {
            filters
                .iter()
                .map(|f| (f.filter_type().as_str().to_string(), f.filter().to_string()))
                .collect()
        });
        assert_eq!(
            filters,
            excluded.map(|filters| filters
                .iter()
                .map(|filter| ("WILDCARD".to_string(), filter.to_string()))
                .collect())
        );
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
}
