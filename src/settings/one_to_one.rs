//! The one-to-one check: no two source images may be swapped to one mirror image. Separate
//! because it is the one check that looks at all the rules together.

use crate::rules::{Prefix, Rule};

/// One way into the mirror, for the one-to-one check: a rule, or `defaultMirror`, whose
/// source is every name (`<registry>/<name>`).
struct Mapping<'r> {
    /// The rule or registry, as messages name it: `mirrors[1]`, `mirrors[0].targets[1]`.
    field: String,
    /// The setting that holds the target: `mirrors[1].target`, `defaultMirror.registry`.
    target_field: String,
    source: Option<&'r Prefix>,
    /// As written, for messages.
    target: &'r Prefix,
    /// As the runtime resolves it, for comparisons: `m.io:443/hub` is `m.io/hub`.
    resolved: Prefix,
}

impl Mapping<'_> {
    /// The source name this way in sends to `target/rest`: `source/rest`, or for
    /// `defaultMirror` `rest` itself.
    fn source_of(&self, rest: &str) -> String {
        match self.source {
            Some(source) => source.join(rest),
            None => rest.to_string(),
        }
    }
}

/// No two distinct source names may map to one mirror name. Two ways in whose targets are
/// equal or nested (`inner` = `outer/suffix`) meet unless the inner one mirrors exactly the
/// outer one's `source/suffix`: then every name under it goes through the inner (more specific)
/// rule to the very place the outer rule would have sent it. With every nested pair so, the
/// ways in that could produce one mirror name all agree on its source name.
///
/// A source under any target never applies either: its images count as already swapped.
pub(super) fn check_one_to_one(
    rules: &[Rule],
    default_mirrors: &[Prefix],
    errors: &mut Vec<String>,
) {
    // One way in per target: a rule's list and defaultMirror's registries each give several,
    // and each is checked against every other, within one list and across lists.
    let mut mappings: Vec<Mapping<'_>> = Vec::new();
    for rule in rules {
        for (k, target) in rule.targets.iter().enumerate() {
            let field = match rule.targets.len() {
                1 => format!("mirrors[{}]", rule.index),
                _ => format!("mirrors[{}].targets[{k}]", rule.index),
            };
            mappings.push(Mapping {
                target_field: format!("{field}.target"),
                field,
                source: Some(&rule.source),
                target: &target.prefix,
                resolved: target.prefix.resolved(),
            });
        }
    }
    for (k, registry) in default_mirrors.iter().enumerate() {
        let (field, target_field) = match default_mirrors.len() {
            1 => (
                "defaultMirror".to_string(),
                "defaultMirror.registry".to_string(),
            ),
            _ => {
                let field = format!("defaultMirror.registries[{k}]");
                (field.clone(), field)
            }
        };
        mappings.push(Mapping {
            field,
            target_field,
            source: None,
            target: registry,
            resolved: registry.resolved(),
        });
    }
    for (i, inner) in mappings.iter().enumerate() {
        for (j, outer) in mappings.iter().enumerate() {
            if i == j {
                continue;
            }
            let Some(suffix) = outer.resolved.strip_from(inner.resolved.as_str()) else {
                continue;
            };
            // Equal targets are reported once, from the later entry.
            if suffix.is_empty() && j > i {
                continue;
            }
            let consistent = !suffix.is_empty()
                && inner.source.map(Prefix::as_str) == Some(outer.source_of(suffix).as_str());
            if consistent {
                continue;
            }
            let rest = match inner.source {
                Some(_) => "app".to_string(),
                None => "docker.io/library/app".to_string(),
            };
            let shared = inner.target.join(&rest);
            let via_inner = inner.source_of(&rest);
            let via_outer = match suffix {
                "" => outer.source_of(&rest),
                suffix => outer.source_of(&Prefix::new(suffix.to_string()).join(&rest)),
            };
            let relation = if suffix.is_empty() {
                format!("is also the target of {}", outer.field)
            } else {
                format!(
                    "lies under {}'s target {:?}",
                    outer.field,
                    outer.target.as_str()
                )
            };
            errors.push(format!(
                "{}: {:?} {relation}, so two images would share one mirror image: {via_inner:?} (via {}) and {via_outer:?} (via {}) would both become {shared:?}; give each rule a target of its own that does not nest in another",
                inner.target_field,
                inner.target.as_str(),
                inner.field,
                outer.field,
            ));
        }
    }
    for rule in rules {
        if let Some(owner) = mappings.iter().find(|m| rule.source.is_within(&m.resolved)) {
            errors.push(format!(
                "mirrors[{}].source: {:?} lies under {}'s target {:?}: its images count as already swapped, so the rule would never apply",
                rule.index,
                rule.source.as_str(),
                owner.field,
                owner.target.as_str()
            ));
        }
    }
}

/// The test the one-to-one rule stands for: over many images and every accepted settings
/// below, no two distinct normalised source references are routed to one mirror reference.
#[cfg(test)]
mod tests {
    use super::super::*;
    use crate::reference::Reference;
    use crate::rules::Route;
    use crate::rules::{Prefix, Router, Rule, Target};
    use std::collections::BTreeMap;

    const ACCEPTED: &[&str] = &[
        r#"{"mirrors":[{"source":"docker.io","target":"m.io/hub"},{"source":"docker.io/library","target":"m.io/hub/library"}]}"#,
        r#"{"mirrors":[{"source":"docker.io","target":"m.io/cache/docker.io"},{"source":"quay.io/argoproj","target":"m.io/cache/quay.io/argoproj"}],"defaultMirror":{"registry":"m.io/cache"}}"#,
        r#"{"mirrors":[{"source":"docker.io","target":"m.io/hub"},{"source":"quay.io","target":"m.io/quay"},{"source":"ghcr.io/org","target":"m.io/gh"}],"defaultMirror":{"registry":"cache.io/all"}}"#,
        r#"{"mirrors":[{"source":"docker.io","targets":[{"target":"m.io/hub"},{"target":"cache.io/hub"}]},{"source":"quay.io","targets":[{"target":"m.io/quay"},{"target":"cache.io/quay"}]}],"defaultMirror":{"registries":["m.io/all","cache.io/all"]}}"#,
    ];

    fn images() -> Vec<String> {
        let hosts = [
            "docker.io",
            "quay.io",
            "ghcr.io",
            "m.io",
            "cache.io",
            "registry.k8s.io",
        ];
        let paths = [
            "app",
            "library/app",
            "official/app",
            "argoproj/app",
            "org/app",
            "hub/app",
            "quay/app",
            "cache/docker.io/app",
            "docker.io/app",
            "quay.io/argoproj/app",
            "docker.io/library/app",
            "library/library/app",
        ];
        let mut images = Vec::new();
        for host in hosts {
            for path in paths {
                images.push(format!("{host}/{path}:1"));
            }
        }
        images
    }

    #[test]
    fn accepted_settings_never_send_two_images_to_one_mirror_image() {
        for settings in ACCEPTED {
            let policy = Policy::from_settings(&parse_settings(settings.as_bytes()).expect("JSON"))
                .unwrap_or_else(|e| panic!("{settings}: {e}"));
            let mut seen: BTreeMap<String, String> = BTreeMap::new();
            for image in images() {
                let reference = Reference::parse(&image).expect("reference");
                let Route::Mirror(destination) = policy.router.route(&reference) else {
                    continue;
                };
                for target in destination.targets {
                    if let Some(before) =
                        seen.insert(target.repository.clone(), reference.name().to_string())
                        && before != reference.name()
                    {
                        panic!(
                            "{settings}: {before} and {} both go to {}",
                            reference.name(),
                            target.repository
                        );
                    }
                }
            }
            assert!(
                seen.len() > 10,
                "{settings}: too few routed to prove anything"
            );
        }
    }

    /// The same images under settings the validation refuses: each does collide, so the
    /// refusal is needed, not merely cautious.
    #[test]
    fn refused_settings_would_collide() {
        for settings in [
            r#"{"mirrors":[{"source":"docker.io","target":"mirror.example.com/hub"},{"source":"quay.io","target":"mirror.example.com/hub"}]}"#,
            r#"{"mirrors":[{"source":"docker.io","target":"m.io/hub"},{"source":"docker.io/library","target":"m.io/hub/official"}]}"#,
            r#"{"mirrors":[{"source":"quay.io","target":"m.io/cache/docker.io"}],"defaultMirror":{"registry":"m.io/cache"}}"#,
            r#"{"mirrors":[{"source":"docker.io","targets":[{"target":"m.io/hub"},{"target":"cache.io/hub"}]},{"source":"quay.io","targets":[{"target":"cache.io/hub"}]}]}"#,
            r#"{"mirrors":[{"source":"docker.io","targets":[{"target":"m.io/hub"},{"target":"m.io/hub/library"}]}]}"#,
        ] {
            let parsed = parse_settings(settings.as_bytes()).expect("JSON");
            assert!(Policy::from_settings(&parsed).is_err(), "{settings}");
            // Route with the checks bypassed, to show the collision the check prevents.
            let mut rules = Vec::new();
            for (index, mirror) in parsed.mirrors.iter().enumerate() {
                let targets = mirror
                    .target
                    .iter()
                    .chain(mirror.targets.iter().map(|t| &t.target))
                    .map(|target| Target {
                        prefix: Prefix::new(target.clone()),
                        pull_secret: None,
                        pull_through: false,
                    })
                    .collect();
                rules.push(Rule {
                    index,
                    source: Prefix::new(mirror.source.clone()),
                    targets,
                });
            }
            let defaults = parsed
                .default_mirror
                .iter()
                .flat_map(|d| d.registry.iter().chain(&d.registries))
                .map(|registry| Prefix::new(registry.clone()))
                .collect();
            let router = Router::new(rules, defaults, Vec::new());
            let mut seen: BTreeMap<String, String> = BTreeMap::new();
            let collided = images().iter().any(|image| {
                let reference = Reference::parse(image).expect("reference");
                match router.route(&reference) {
                    Route::Mirror(d) => d.targets.into_iter().any(|target| {
                        seen.insert(target.repository, reference.name().to_string())
                            .is_some_and(|before| before != reference.name())
                    }),
                    _ => false,
                }
            });
            assert!(
                collided,
                "{settings}: no collision found among the sample images"
            );
        }
    }
}
