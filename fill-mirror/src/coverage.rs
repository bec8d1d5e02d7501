//! Which namespaces the swapping policy covers, so that workload templates and Pods' records
//! are read only where the policy would swap their Pods: its ClusterAdmissionPolicy's
//! `namespaceSelector` (kube's own `Selector` does the matching), against each namespace's
//! labels as the watch of namespaces keeps them. A record in a namespace the policy does not
//! cover was not written by it, and is ignored.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::core::{Selector, SelectorExt};
use serde_json::Value;

#[derive(Clone, Debug, Default)]
pub struct Coverage {
    /// None: every namespace (no selector, or settings from a file).
    selector: Option<Selector>,
    /// Each namespace's labels, as last seen.
    namespaces: BTreeMap<String, BTreeMap<String, String>>,
}

impl Coverage {
    /// Reads the policy object's `spec.namespaceSelector`; says whether the selector changed.
    /// A selector that cannot be read covers nothing, and says why: filling for namespaces the
    /// policy may not cover costs copies nobody asked for.
    pub fn follow(&mut self, policy: &Value) -> Result<bool, String> {
        let selector = match policy.pointer("/spec/namespaceSelector") {
            None | Some(Value::Null) => None,
            Some(value) => {
                let read = serde_json::from_value::<LabelSelector>(value.clone())
                    .map_err(|e| e.to_string())
                    .and_then(|written| Selector::try_from(written).map_err(|e| e.to_string()));
                match read {
                    Ok(selector) => Some(selector),
                    Err(error) => {
                        self.selector = Some(nothing());
                        return Err(format!("spec.namespaceSelector {value}: {error}"));
                    }
                }
            }
        };
        let changed = selector != self.selector;
        self.selector = selector;
        Ok(changed)
    }

    /// A namespace as the watch saw it; says whether its labels changed.
    pub fn namespace_seen(&mut self, name: &str, labels: BTreeMap<String, String>) -> bool {
        self.namespaces.insert(name.to_string(), labels.clone()) != Some(labels)
    }

    pub fn namespace_gone(&mut self, name: &str) {
        self.namespaces.remove(name);
    }

    /// Whether the policy covers `namespace`. Under a selector, a namespace not seen yet is not
    /// covered: its templates are routed again once it is.
    pub fn covers(&self, namespace: &str) -> bool {
        match &self.selector {
            None => true,
            Some(selector) => self
                .namespaces
                .get(namespace)
                .is_some_and(|labels| selector.matches(labels)),
        }
    }
}

/// A selector no namespace matches.
fn nothing() -> Selector {
    Selector::from(kube::core::Expression::In(
        "image-swapper.kubewarden.io/unreadable-namespace-selector".to_string(),
        Default::default(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn coverage(selector: Value) -> Coverage {
        let mut coverage = Coverage::default();
        coverage.namespace_seen(
            "team",
            labels(&[("kubernetes.io/metadata.name", "team"), ("swap", "yes")]),
        );
        coverage.namespace_seen(
            "kube-system",
            labels(&[("kubernetes.io/metadata.name", "kube-system")]),
        );
        let readable = coverage.follow(&json!({"spec": {"namespaceSelector": selector.clone()}}));
        assert_eq!(
            readable.is_ok(),
            selector.pointer("/matchExpressions/0/operator") != Some(&json!("Sometimes")),
            "{readable:?}"
        );
        coverage
    }

    #[rstest::rstest]
    #[case::no_selector(Value::Null, true, true, true)]
    #[case::match_labels(json!({"matchLabels": {"swap": "yes"}}), true, false, false)]
    #[case::not_in(
        json!({"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system"]}]}),
        true,
        false,
        false
    )]
    #[case::an_unreadable_selector_covers_nothing(
        json!({"matchExpressions": [{"key": "swap", "operator": "Sometimes"}]}),
        false,
        false,
        false
    )]
    fn templates_are_filled_where_the_policy_swaps(
        #[case] selector: Value,
        #[case] team: bool,
        #[case] kube_system: bool,
        #[case] unseen: bool,
    ) {
        let coverage = coverage(selector);
        assert_eq!(coverage.covers("team"), team);
        assert_eq!(coverage.covers("kube-system"), kube_system);
        assert_eq!(coverage.covers("not-seen-yet"), unseen);
    }

    #[test]
    fn a_changed_selector_or_namespace_is_told() {
        let mut coverage = Coverage::default();
        assert_eq!(coverage.follow(&json!({"spec": {}})), Ok(false));
        let selector = json!({"spec": {"namespaceSelector": {"matchLabels": {"swap": "yes"}}}});
        assert_eq!(coverage.follow(&selector), Ok(true));
        assert_eq!(coverage.follow(&selector), Ok(false));
        assert!(coverage.namespace_seen("team", labels(&[("swap", "yes")])));
        assert!(!coverage.namespace_seen("team", labels(&[("swap", "yes")])));
        assert!(coverage.namespace_seen("team", labels(&[("swap", "no")])));
    }
}
