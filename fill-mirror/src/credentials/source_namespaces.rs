//! Which namespaces' copies may use the login the auth file holds for a source registry
//! (`--source-namespaces HOST=NAMESPACE,...`). The auth file is the controller's, shared by every
//! copy: without this, a tenant who may not pull a private image could create a Pod naming it
//! and have the controller copy it with its own login, and the next Pod run it from the mirror.
//! A source host not listed is read anonymously for every copy: a public image still fills.

use std::collections::{BTreeMap, BTreeSet};

use anyhow::{bail, ensure};

use super::sources::valid_host;

/// The namespaces listed for one host.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Listed {
    /// `*`: any namespace.
    Any,
    Namespaces(BTreeSet<String>),
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SourceNamespaces(BTreeMap<String, Listed>);

impl SourceNamespaces {
    /// Reads each `HOST=NAMESPACE[,NAMESPACE...]` (`*`: any namespace); a host named twice
    /// gets the namespaces of both.
    pub fn parse(values: &[String]) -> anyhow::Result<SourceNamespaces> {
        let mut listed = BTreeMap::new();
        for value in values {
            let Some((host, namespaces)) = value.split_once('=') else {
                bail!("--source-namespaces {value:?}: not HOST=NAMESPACE[,NAMESPACE...]");
            };
            ensure!(
                valid_host(host),
                "--source-namespaces {value:?}: {host:?} is not a registry host"
            );
            let names: BTreeSet<String> = namespaces
                .split(',')
                .map(str::trim)
                .map(str::to_string)
                .collect();
            ensure!(
                names.iter().all(|name| !name.is_empty()),
                "--source-namespaces {value:?}: an empty namespace"
            );
            let entry = listed
                .entry(host.to_string())
                .or_insert_with(|| Listed::Namespaces(BTreeSet::new()));
            match entry {
                _ if names.contains("*") => *entry = Listed::Any,
                Listed::Any => {}
                Listed::Namespaces(known) => known.extend(names),
            }
        }
        Ok(SourceNamespaces(listed))
    }

    /// Whether a copy from `host` that `requesters` (namespaces) ask for may use the host's
    /// login: one of them is listed for it.
    pub fn allows(&self, host: &str, requesters: &BTreeSet<String>) -> bool {
        match self.0.get(host) {
            None => false,
            Some(Listed::Any) => true,
            Some(Listed::Namespaces(listed)) => requesters.iter().any(|ns| listed.contains(ns)),
        }
    }

    /// Of `hosts` (the auth file's), the ones listed for no namespace.
    pub fn unlisted<'h>(&self, hosts: impl IntoIterator<Item = &'h str>) -> Vec<&'h str> {
        hosts
            .into_iter()
            .filter(|host| !self.0.contains_key(*host))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn namespaces(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|n| n.to_string()).collect()
    }

    #[test]
    fn a_login_is_used_only_for_the_namespaces_listed_for_its_host() {
        let listed = SourceNamespaces::parse(&[
            "registry.example.com=payroll,finance".to_string(),
            "docker.io=*".to_string(),
            "registry.example.com=audit".to_string(),
        ])
        .expect("valid");
        let host = "registry.example.com";
        assert!(listed.allows(host, &namespaces(&["payroll"])));
        assert!(listed.allows(host, &namespaces(&["tenant", "audit"])));
        assert!(!listed.allows(host, &namespaces(&["tenant"])));
        assert!(!listed.allows(host, &namespaces(&[])));
        assert!(listed.allows("docker.io", &namespaces(&["tenant"])));
        assert!(!listed.allows("quay.io", &namespaces(&["payroll"])));
        assert_eq!(
            listed.unlisted(["docker.io", "quay.io", "mirror.example.com"]),
            ["quay.io", "mirror.example.com"]
        );
    }

    #[rstest::rstest]
    #[case::no_equals("registry.example.com")]
    #[case::not_a_host("https://registry.example.com=payroll")]
    #[case::an_empty_namespace("registry.example.com=payroll,")]
    fn a_listing_that_is_not_host_and_namespaces_is_refused(#[case] value: &str) {
        assert!(SourceNamespaces::parse(&[value.to_string()]).is_err());
    }
}
