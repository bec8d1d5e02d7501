//! Image references, parsed and normalised as container runtimes do, without regular expressions.
//!
//! The grammar is the distribution reference grammar (the one `oci-spec` encodes in a regular
//! expression); normalisation follows `distribution/reference.ParseNormalizedNamed`, which
//! containerd and CRI-O use, so the policy and the kubelet agree on what an image string names:
//!
//! ```text
//! reference        := name [ ":" tag ] [ "@" digest ]
//! name             := [ domain "/" ] path-component *( "/" path-component )
//! domain           := domain-component *( "." domain-component ) [ ":" port ]
//! domain-component := [a-zA-Z0-9] | [a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9]
//! path-component   := [a-z0-9]+ *( separator [a-z0-9]+ ),  separator := [._] | "__" | "-"+
//! tag              := [A-Za-z0-9_][A-Za-z0-9_.-]{0,127}
//! digest           := algorithm ":" hex{32,}, algorithm in sha256 | sha384 | sha512
//! ```
//!
//! A regular expression would be compiled at every admission, because policy-server instantiates
//! the module afresh for every request; this parser allocates only the parts it returns.

use std::fmt;

/// The registry that names without a registry host refer to.
pub const DOCKER_HUB: &str = "docker.io";
/// Docker Hub's other names for its registry: normalised references, and targets as the
/// runtime resolves them, always say `docker.io`.
pub const DOCKER_HUB_ALIASES: [&str; 2] = ["index.docker.io", "registry-1.docker.io"];
const DOCKER_HUB_LEGACY: &str = "index.docker.io";
const DOCKER_HUB_OFFICIAL: &str = "library";
const DEFAULT_TAG: &str = "latest";
/// The longest repository name, registry host included, that distribution accepts.
pub const NAME_MAX_LEN: usize = 255;
const TAG_MAX_LEN: usize = 128;

/// A normalised image reference: `nginx` is `docker.io/library/nginx:latest`.
///
/// One string holds the whole normalised reference and the parts are slices of it, so that
/// rule matching and messages need no further allocation or formatting.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reference {
    /// `domain/path[:tag][@digest]`.
    text: String,
    domain_end: usize,
    name_end: usize,
    /// Where `:tag` ends (`name_end` when there is no tag).
    tag_end: usize,
}

/// Why an image string is not a reference a container runtime would pull.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ParseError {
    Empty,
    InvalidFormat,
    NameTooLong,
    HexIdentifier,
    TagInvalid,
    DigestInvalid,
    DigestUnsupported,
    DigestLength,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ParseError::Empty => "the reference is empty",
            ParseError::InvalidFormat => "invalid reference format",
            ParseError::NameTooLong => "the repository name is longer than 255 characters",
            ParseError::HexIdentifier => {
                "a 64-character hexadecimal string is an image ID, not a reference"
            }
            ParseError::TagInvalid => "invalid tag format",
            ParseError::DigestInvalid => "invalid digest format",
            ParseError::DigestUnsupported => {
                "unsupported digest algorithm (sha256, sha384, sha512)"
            }
            ParseError::DigestLength => "the digest has the wrong length for its algorithm",
        })
    }
}

impl Reference {
    /// Parses and normalises an image string as a container runtime does.
    pub fn parse(input: &str) -> Result<Reference, ParseError> {
        if input.is_empty() {
            return Err(ParseError::Empty);
        }
        if input.len() == 64 && input.bytes().all(is_lower_hex) {
            return Err(ParseError::HexIdentifier);
        }
        let (rest, digest) = match input.split_once('@') {
            Some((rest, digest)) => (rest, Some(parse_digest(digest)?)),
            None => (input, None),
        };
        // A ':' is a tag separator only when no '/' follows it; before a '/' it is a port.
        let (name, tag) = match rest.rsplit_once(':') {
            Some((name, tag)) if !tag.contains('/') => (name, Some(tag)),
            _ => (rest, None),
        };
        if tag.is_some_and(|tag| !is_tag(tag)) {
            return Err(ParseError::TagInvalid);
        }
        if !is_name(name) {
            return Err(ParseError::InvalidFormat);
        }
        let (domain, official, path) = split_domain(name);
        let tag = match (tag, &digest) {
            (None, None) => Some(DEFAULT_TAG),
            (tag, _) => tag,
        };
        let mut text = String::with_capacity(input.len() + 24);
        text.push_str(domain);
        let domain_end = text.len();
        text.push('/');
        if official {
            text.push_str(DOCKER_HUB_OFFICIAL);
            text.push('/');
        }
        text.push_str(path);
        let name_end = text.len();
        if name_end > NAME_MAX_LEN {
            return Err(ParseError::NameTooLong);
        }
        if let Some(tag) = tag {
            text.push(':');
            text.push_str(tag);
        }
        let tag_end = text.len();
        if let Some(digest) = digest {
            text.push('@');
            text.push_str(digest);
        }
        Ok(Reference {
            text,
            domain_end,
            name_end,
            tag_end,
        })
    }

    /// The registry host, with its port when it has one.
    pub fn domain(&self) -> &str {
        &self.text[..self.domain_end]
    }

    /// The repository path inside the registry, e.g. `library/nginx`.
    pub fn path(&self) -> &str {
        &self.text[self.domain_end + 1..self.name_end]
    }

    pub fn tag(&self) -> Option<&str> {
        self.text.get(self.name_end + 1..self.tag_end)
    }

    pub fn digest(&self) -> Option<&str> {
        self.text.get(self.tag_end + 1..)
    }

    /// `domain/path`: what mirror rules match on.
    pub fn name(&self) -> &str {
        &self.text[..self.name_end]
    }

    /// The whole normalised reference, as `Display` writes it.
    pub fn as_str(&self) -> &str {
        &self.text
    }
}

impl fmt::Display for Reference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// distribution's `splitDockerDomain`: the first segment is a registry host when it has a '.' or
/// a ':', is `localhost`, or has an upper-case letter (a repository path never does).
/// Returns the domain, whether Docker Hub's `library/` goes before the path, and the path.
fn split_domain(name: &str) -> (&str, bool, &str) {
    let (domain, remainder) = match name.split_once('/') {
        Some((first, rest))
            if first.contains(['.', ':'])
                || first == "localhost"
                || first.bytes().any(|b| b.is_ascii_uppercase()) =>
        {
            (first, rest)
        }
        _ => (DOCKER_HUB, name),
    };
    let domain = if domain == DOCKER_HUB_LEGACY {
        DOCKER_HUB
    } else {
        domain
    };
    (
        domain,
        domain == DOCKER_HUB && !remainder.contains('/'),
        remainder,
    )
}

/// Checks a digest (`algorithm:hex`) and returns it unchanged.
pub fn parse_digest(digest: &str) -> Result<&str, ParseError> {
    let (algorithm, hex) = digest.split_once(':').ok_or(ParseError::DigestInvalid)?;
    if !is_digest_algorithm(algorithm)
        || hex.len() < 32
        || !hex.bytes().all(|b| b.is_ascii_hexdigit())
    {
        return Err(ParseError::DigestInvalid);
    }
    let expected_len = match algorithm {
        "sha256" => 64,
        "sha384" => 96,
        "sha512" => 128,
        _ => return Err(ParseError::DigestUnsupported),
    };
    if hex.len() != expected_len {
        return Err(ParseError::DigestLength);
    }
    Ok(digest)
}

/// `[A-Za-z][A-Za-z0-9]*` components joined by one of `-_+.`.
fn is_digest_algorithm(algorithm: &str) -> bool {
    algorithm.split(['-', '_', '+', '.']).all(|component| {
        let mut bytes = component.bytes();
        matches!(bytes.next(), Some(b) if b.is_ascii_alphabetic())
            && bytes.all(|b| b.is_ascii_alphanumeric())
    })
}

fn is_lower_hex(b: u8) -> bool {
    b.is_ascii_digit() || (b'a'..=b'f').contains(&b)
}

fn is_word(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

fn is_tag(tag: &str) -> bool {
    let bytes = tag.as_bytes();
    match bytes.split_first() {
        Some((first, rest)) => {
            bytes.len() <= TAG_MAX_LEN
                && is_word(*first)
                && rest.iter().all(|&b| is_word(b) || b == b'.' || b == b'-')
        }
        None => false,
    }
}

/// `[domain "/"] path-component *("/" path-component)`.
fn is_name(name: &str) -> bool {
    let (first, rest) = match name.split_once('/') {
        Some((first, rest)) => (first, Some(rest)),
        None => (name, None),
    };
    rest.is_none_or(|rest| rest.split('/').all(is_path_component))
        && (is_path_component(first) || (rest.is_some() && is_domain(first)))
}

/// `[a-z0-9]+ *(separator [a-z0-9]+)` where a separator is `.`, `_`, `__` or a run of `-`.
pub fn is_path_component(component: &str) -> bool {
    let bytes = component.as_bytes();
    let alnum = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    if !matches!((bytes.first(), bytes.last()), (Some(&f), Some(&l)) if alnum(f) && alnum(l)) {
        return false;
    }
    let mut i = 0;
    while i < bytes.len() {
        if alnum(bytes[i]) {
            i += 1;
            continue;
        }
        let start = i;
        while i < bytes.len() && !alnum(bytes[i]) {
            i += 1;
        }
        let separator = &bytes[start..i];
        let valid = separator == b"."
            || separator == b"_"
            || separator == b"__"
            || separator.iter().all(|&b| b == b'-');
        if !valid {
            return false;
        }
    }
    true
}

/// `domain-component *("." domain-component) [":" port]`.
pub fn is_domain(domain: &str) -> bool {
    let (host, port) = match domain.split_once(':') {
        Some((host, port)) => (host, Some(port)),
        None => (domain, None),
    };
    let port_ok = port.is_none_or(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
    port_ok && host.split('.').all(is_domain_component)
}

fn is_domain_component(component: &str) -> bool {
    let bytes = component.as_bytes();
    match (bytes.first(), bytes.last()) {
        (Some(f), Some(l)) => {
            f.is_ascii_alphanumeric()
                && l.is_ascii_alphanumeric()
                && bytes
                    .iter()
                    .all(|&b| b.is_ascii_alphanumeric() || b == b'-')
        }
        _ => false,
    }
}

/// Whether a registry host is written so that runtimes read it as a host, not as a Docker Hub
/// namespace: `mirror/x` would be pulled from `docker.io/mirror/x`.
pub fn looks_like_registry_host(domain: &str) -> bool {
    domain.contains(['.', ':']) || domain == "localhost"
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    const D: &str = "sha256:ffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff";

    #[rstest]
    #[case::short_name("nginx", "docker.io/library/nginx:latest")]
    #[case::official_namespace("library/nginx", "docker.io/library/nginx:latest")]
    #[case::user_namespace("bitnami/redis:7", "docker.io/bitnami/redis:7")]
    #[case::legacy_hub_host("index.docker.io/nginx:1", "docker.io/library/nginx:1")]
    #[case::hub_host_short("docker.io/nginx", "docker.io/library/nginx:latest")]
    #[case::host_port_path_tag("host:5000/a/b:t", "host:5000/a/b:t")]
    #[case::localhost("localhost/app", "localhost/app:latest")]
    #[case::port_alone_is_a_tag("test.com:5000", "docker.io/library/test.com:5000")]
    #[case::tag_and_digest(&format!("repo:tag@{D}"), &format!("docker.io/library/repo:tag@{D}"))]
    #[case::digest_only_gets_no_tag(&format!("repo@{D}"), &format!("docker.io/library/repo@{D}"))]
    #[case::upper_case_tag("lowercase:Uppercase", "docker.io/library/lowercase:Uppercase")]
    #[case::upper_case_first_segment_is_a_host("Foo/bar", "Foo/bar:latest")]
    #[case::separators("org/a.b_c__d---e", "docker.io/org/a.b_c__d---e:latest")]
    #[case::dotted_first_segment_is_a_host("a.b/c", "a.b/c:latest")]
    fn normalises_as_runtimes_do(#[case] input: &str, #[case] normalised: &str) {
        assert_eq!(
            Reference::parse(input).map(|r| r.to_string()),
            Ok(normalised.to_string())
        );
    }

    #[rstest]
    #[case::empty("", ParseError::Empty)]
    #[case::upper_case_repository("Nginx", ParseError::InvalidFormat)]
    #[case::upper_case_path("docker.io/Library/nginx", ParseError::InvalidFormat)]
    #[case::garbage("!!!", ParseError::InvalidFormat)]
    #[case::spaces("nginx latest", ParseError::InvalidFormat)]
    #[case::only_tag(":tag", ParseError::InvalidFormat)]
    #[case::only_digest(&format!("@{D}"), ParseError::InvalidFormat)]
    #[case::trailing_slash("nginx/", ParseError::InvalidFormat)]
    #[case::double_slash("a//b", ParseError::InvalidFormat)]
    #[case::two_colons("a:b:c", ParseError::InvalidFormat)]
    #[case::bad_tag("nginx:-x", ParseError::TagInvalid)]
    #[case::long_tag(&format!("nginx:{}", "a".repeat(129)), ParseError::TagInvalid)]
    #[case::short_digest("repo@sha256:ffff", ParseError::DigestInvalid)]
    #[case::digest_length(
        "repo@sha256:ffffffffffffffffffffffffffffffffff",
        ParseError::DigestLength
    )]
    #[case::digest_algorithm(&format!("repo@md5:{}", "f".repeat(32)), ParseError::DigestUnsupported)]
    #[case::hex_identifier(&"f".repeat(64), ParseError::HexIdentifier)]
    #[case::name_too_long(&"a".repeat(240), ParseError::NameTooLong)]
    fn rejects_what_runtimes_reject(#[case] input: &str, #[case] error: ParseError) {
        assert_eq!(Reference::parse(input), Err(error));
    }

    #[test]
    fn name_joins_domain_and_path() {
        let reference = Reference::parse("quay.io/argoproj/argocd:v2").expect("valid reference");
        assert_eq!(
            (
                reference.domain(),
                reference.path(),
                reference.tag(),
                reference.name()
            ),
            (
                "quay.io",
                "argoproj/argocd",
                Some("v2"),
                "quay.io/argoproj/argocd"
            )
        );
    }

    #[test]
    fn parts_are_slices_of_the_normalised_reference() {
        let reference = Reference::parse(&format!("localhost:5000/a/b:t@{D}")).expect("valid");
        assert_eq!(
            (
                reference.domain(),
                reference.path(),
                reference.tag(),
                reference.digest()
            ),
            ("localhost:5000", "a/b", Some("t"), Some(D))
        );
        let digest_only = Reference::parse(&format!("nginx@{D}")).expect("valid");
        assert_eq!((digest_only.tag(), digest_only.digest()), (None, Some(D)));
        assert_eq!(digest_only.name(), "docker.io/library/nginx");
        let tag_only = Reference::parse("nginx").expect("valid");
        assert_eq!((tag_only.tag(), tag_only.digest()), (Some("latest"), None));
    }

    /// `oci-spec`'s regular-expression parser diverges from the runtimes on these inputs; the
    /// runtimes decide what the kubelet pulls, so this parser follows them.
    fn runtime_divergence(input: &str) -> bool {
        let first = input.split('/').next().unwrap_or_default();
        let tag = input
            .split('@')
            .next()
            .unwrap_or_default()
            .rsplit_once(':')
            .map(|(_, t)| t);
        // An upper-case first segment is a host for distribution, a Docker Hub namespace for oci-spec.
        (input.contains('/') && first.bytes().any(|b| b.is_ascii_uppercase()) && !first.contains(['.', ':']))
            // oci-spec's \w accepts Unicode letters in tags; Go's \w is ASCII.
            || tag.is_some_and(|t| !t.is_ascii())
            // distribution limits the whole normalised name, host included, to 255 characters.
            || input.len() > 200
            // distribution refuses a bare 64-character hexadecimal image ID.
            || (input.len() == 64 && input.bytes().all(is_lower_hex))
    }

    fn agreement_table() -> Vec<String> {
        let mut table: Vec<String> = [
            "busybox", "test.com:tag", "test.com:5000", "test.com/repo:tag", "test:5000/repo",
            "test:5000/repo:tag", "lowercase:Uppercase", "sub-dom1.foo.com/bar/baz/quux",
            "sub-dom1.foo.com/bar/baz/quux:some-long-tag", "b.gcr.io/test.example.com/my-app:test.example.com",
            "xn--n3h.com/myimage:xn--n3h.com", "foo_bar.com:8080", "foo/foo_bar.com:8080", "opensuse/leap:15.3",
            "", ":justtag", "aa/asdf$$^/aa", "uppercase/:tag", "Uppercase:tag", "Uppercase/lowercase:tag",
            "a:b:c", "a//b", "a/", "/a", "-a", "a-", "a--b", "a___b", "a__b", "a._b", "a.-b", "a..b",
            "localhost/x", "localhost:5000/x", "localhost", "127.0.0.1:5000/a/b", "[::1]:5000/a",
            "host:port/a", "host:/a", "ho_st.com/a", "-host.com/a", "host-.com/a", "ho-st.com/a",
            "registry.k8s.io/pause:3.9", "gcr.io/distroless/static:nonroot", "nginx:latest ", " nginx",
            "nginx:", "nginx:.x", "nginx:_x", "nginx:x.-_", "nginx:é", "nginx@", "nginx@sha256",
            "nginx@sha256:", "nginx@SHA256:ffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff",
            "nginx@sha256:FFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFF",
            "nginx@sha256:gfffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff",
            "nginx@sha512:ffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff",
            "nginx@sha384:ffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff",
            "nginx@foo+bar:ffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff",
            "nginx@1sha:ffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff",
            "nginx:t@sha256:ffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff@x",
            "ffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff",
            "ffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff:tag",
            "nginx\u{0}", "ngi\nnx", "ñginx", "docker.io", "docker.io/", "index.docker.io/library/x",
            "Docker.io/x", "a.B.c/x", "A/b/c", "a/B/c",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let domains = [
            "",
            "quay.io/",
            "host:5000/",
            "localhost/",
            "my-host.example.com:443/",
            "Reg.io/",
            "a_b.io/",
        ];
        let paths = [
            "x",
            "org/app",
            "a/b/c/d",
            "library/nginx",
            "a.b-c__d",
            "UP",
            "a..b",
            "x/",
        ];
        let tags = ["", ":1.27", ":v1.0-rc_1", ":-bad", ":latest"];
        let digests = [
            "",
            "@sha256:3a25d2cf3a25d2cf3a25d2cf3a25d2cf3a25d2cf3a25d2cf3a25d2cf3a25d2cf",
            "@sha256:abc",
        ];
        for domain in domains {
            for path in paths {
                for tag in tags {
                    for digest in digests {
                        table.push(format!("{domain}{path}{tag}{digest}"));
                    }
                }
            }
        }
        for len in [180, 200, 235, 236, 237, 246, 247, 250, 255, 256] {
            table.push("a".repeat(len));
            table.push(format!("quay.io/{}", "b".repeat(len)));
        }
        table
    }

    #[test]
    fn agrees_with_oci_spec_outside_documented_runtime_divergences() {
        let table = agreement_table();
        assert!(
            table.len() > 900,
            "the table should be large: {}",
            table.len()
        );
        let mut compared = 0;
        for input in &table {
            if runtime_divergence(input) {
                continue;
            }
            compared += 1;
            let ours = Reference::parse(input).map(|r| r.to_string()).ok();
            let theirs = oci_spec::distribution::Reference::try_from(input.as_str())
                .map(|r| r.whole())
                .ok();
            assert_eq!(ours, theirs, "disagreement on {input:?}");
        }
        assert!(compared > 900, "compared only {compared} references");
    }

    #[rstest]
    #[case::upper_case_first_segment("Uppercase/lowercase:tag", Some("Uppercase/lowercase:tag"))]
    #[case::unicode_tag("nginx:é", None)]
    #[case::hex_identifier(&"f".repeat(64), None)]
    #[case::long_name_with_hub_prefix(&"a".repeat(240), None)]
    fn divergences_from_oci_spec_follow_the_runtimes(
        #[case] input: &str,
        #[case] ours: Option<&str>,
    ) {
        assert!(runtime_divergence(input));
        let theirs = oci_spec::distribution::Reference::try_from(input)
            .map(|r| r.whole())
            .ok();
        assert_ne!(
            theirs.as_deref(),
            ours,
            "oci-spec no longer diverges on {input:?}"
        );
        assert_eq!(
            Reference::parse(input)
                .map(|r| r.to_string())
                .ok()
                .as_deref(),
            ours
        );
    }
}
