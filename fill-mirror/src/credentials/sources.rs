//! Kubewarden's `sources.yaml` (insecure hosts, private CAs), read as policy-server reads it,
//! and written as skopeo's `--cert-dir` layout.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use anyhow::Context;
use base64::Engine;
use serde::Deserialize;

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
pub(super) fn valid_host(host: &str) -> bool {
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
    pub(super) insecure: BTreeSet<String>,
    pub(super) cert_dirs: BTreeMap<String, PathBuf>,
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

#[cfg(test)]
mod tests {
    use super::*;

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
