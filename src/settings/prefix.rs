//! Registry hosts and paths as the settings write them: `source`, `target` and
//! `defaultMirror.registry` are all `host[:port][/path]`, checked the same way.

use crate::reference::{self, is_domain, is_path_component, looks_like_registry_host};
use crate::rules::Prefix;

/// `host[:port][/path]`: a registry host runtimes read as a host, and lower-case path segments.
pub(super) fn parse_prefix(field: &str, value: &str) -> Result<Prefix, String> {
    let (host, path) = match value.split_once('/') {
        Some((host, path)) => (host, Some(path)),
        None => (value, None),
    };
    if value.is_empty() {
        return Err(format!(
            "{field}: the value is empty; write a registry host, e.g. \"mirror.example.com/dockerhub\""
        ));
    }
    if value.contains(['@']) || path.is_some_and(|p| p.contains(':')) {
        return Err(format!(
            "{field}: {value:?} names an image; write a registry host and optional path, without tag or digest"
        ));
    }
    if !is_domain(host) {
        return Err(format!(
            "{field}: {value:?}: {host:?} is not a valid registry host[:port]"
        ));
    }
    // Runtimes keep a host as written, and images name hosts in lower case: a rule for
    // "Quay.io" would match no image, and a target with capitals would never be recognised as
    // the "quay.io" an image names. Checked before the host's form: runtimes read a first
    // segment with capitals as a host ("FOO/bar" is host FOO), so "FOO" fails for its capitals,
    // not for wanting a '.'.
    if host.bytes().any(|b| b.is_ascii_uppercase()) {
        let lower = host.to_ascii_lowercase();
        let fix = if looks_like_registry_host(&lower) {
            format!("write {:?}", value.replacen(host, &lower, 1))
        } else {
            format!(
                "write the registry's host name in lower case with its domain or port ({lower:?} alone would be read as docker.io/{lower})"
            )
        };
        return Err(format!(
            "{field}: {value:?}: registry host {host:?} has upper-case letters, and image references are matched as written (in lower case): {fix}"
        ));
    }
    if !looks_like_registry_host(host) {
        return Err(format!(
            "{field}: {value:?}: {host:?} is not a registry host (it needs a '.', a ':port' or to be localhost), so runtimes would read it as docker.io/{value}"
        ));
    }
    if let Some(bad) = path
        .into_iter()
        .flat_map(|p| p.split('/'))
        .find(|s| !is_path_component(s))
    {
        return Err(format!(
            "{field}: {value:?}: path segment {bad:?} is not valid (lower-case letters, digits, and '.', '_', '-' between them)"
        ));
    }
    let host = if host == "index.docker.io" {
        reference::DOCKER_HUB
    } else {
        host
    };
    let prefix = match path {
        Some(path) => format!("{host}/{path}"),
        None => host.to_string(),
    };
    if prefix.len() >= reference::NAME_MAX_LEN {
        return Err(format!(
            "{field}: {value:?} is longer than a repository name may be"
        ));
    }
    Ok(Prefix::new(prefix))
}

/// A Kubernetes Secret name: a DNS-1123 subdomain.
pub(super) fn is_secret_name(name: &str) -> bool {
    name.len() <= 253
        && name.split('.').all(|label| {
            let bytes = label.as_bytes();
            let alnum = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit();
            matches!((bytes.first(), bytes.last()), (Some(f), Some(l)) if alnum(f) && alnum(l))
                && bytes.iter().all(|b| alnum(b) || *b == b'-')
        })
}

/// Whether a target is Docker Hub itself, without a path: runtimes read a one-segment name
/// there as `library/<name>`, so `<source>/app` and `<source>/library/app` would meet.
pub(super) fn is_bare_docker_hub(target: &Prefix) -> bool {
    target.resolved().as_str() == reference::DOCKER_HUB
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    #[rstest]
    #[case::https_port("m.io:443/hub", "m.io/hub")]
    #[case::http_port("m.io:80", "m.io")]
    #[case::other_port("m.io:5000/hub", "m.io:5000/hub")]
    #[case::docker_hub_alias("registry-1.docker.io/org", "docker.io/org")]
    #[case::docker_hub_alias_with_port("index.docker.io:443/org", "docker.io/org")]
    #[case::as_written("quay.io/org", "quay.io/org")]
    fn targets_compare_as_the_runtime_resolves_them(
        #[case] written: &str,
        #[case] resolved_as: &str,
    ) {
        assert_eq!(
            Prefix::new(written.to_string()).resolved().as_str(),
            resolved_as
        );
    }
}
