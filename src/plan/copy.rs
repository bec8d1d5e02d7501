//! One copy the plan names, source and destination, as the fill job runs it: read back from the
//! one command form the policy writes, and warmed instead of pushed under a pull-through cache.
//! Apart from the record because reports and workload templates name copies too.

use crate::decide::images::source_image;
use crate::policy::Policy;

use super::copies::{COPY_COMMAND, fill_command};
use super::warm::{Warm, warm_for};

/// One copy: `skopeo copy --all --preserve-digests docker://SOURCE docker://DESTINATION`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Copy {
    pub source: String,
    pub destination: String,
    /// Set when the destination lies under a target marked `pullThrough`: the manifest GET
    /// that fills the cache instead of the push, which a cache refuses ([`Copy::under`]).
    pub warm: Option<Warm>,
}

impl Copy {
    /// The copy a command in the policy's form names: exactly [`COPY_COMMAND`], then
    /// `docker://SOURCE docker://DESTINATION`, both in the reference grammar's characters.
    /// Anything else is `None`: a command is never run, only read.
    pub fn parse(command: &str) -> Option<Copy> {
        let rest = command.strip_prefix(COPY_COMMAND)?.strip_prefix(' ')?;
        let (source, destination) = rest.split_once(' ')?;
        let source = source.strip_prefix("docker://")?;
        let destination = destination.strip_prefix("docker://")?;
        let grammar = |text: &str| {
            !text.is_empty()
                && text
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"._:@/-".contains(&b))
        };
        (grammar(source) && grammar(destination)).then(|| Copy {
            source: source.to_string(),
            destination: destination.to_string(),
            warm: None,
        })
    }

    /// This copy as `policy` fills its destination: warmed instead of pushed when the
    /// destination lies under a pull-through cache. `image` is what the Pod or template names,
    /// when known (its tag is what the cache fills on; [`Warm`]).
    pub fn under(mut self, policy: &Policy, image: Option<&str>) -> Copy {
        self.warm = warm_for(&self.source, &self.destination, image, policy);
        self
    }

    /// The registry host of the source: what a backoff on 429 and 5xx is kept for.
    pub fn source_host(&self) -> &str {
        self.source.split('/').next().unwrap_or_default()
    }

    /// The registry host of the destination: the target registry the metrics name.
    pub fn destination_host(&self) -> &str {
        self.destination.split('/').next().unwrap_or_default()
    }
}

impl std::fmt::Display for Copy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.source, self.destination)
    }
}

/// The copy that fills the mirror with `image` ahead of any Pod (a workload template names
/// it): the one a Pod's record would name for a container running it, or `None` when no rule
/// routes it (unmatched, excluded, already under a target, not a reference).
pub fn copy_for(image: &str, policy: &Policy) -> Option<Copy> {
    source_image(image, policy)
        .and_then(|source| Copy::parse(&fill_command(&source)))
        .map(|copy| copy.under(policy, Some(image)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[rstest::rstest]
    #[case::the_form(
        "skopeo copy --all --preserve-digests docker://a.io/x:1 docker://m.io/x:1",
        true
    )]
    #[case::no_scheme(
        "skopeo copy --all --preserve-digests a.io/x:1 docker://m.io/x:1",
        false
    )]
    #[case::a_shell_character(
        "skopeo copy --all --preserve-digests docker://a.io/x:1;rm docker://m.io/x:1",
        false
    )]
    #[case::another_flag(
        "skopeo copy --all --preserve-digests --remove-signatures docker://a.io/x:1 docker://m.io/x:1",
        false
    )]
    fn only_the_policy_s_copy_form_is_read(#[case] command: &str, #[case] read: bool) {
        assert_eq!(Copy::parse(command).is_some(), read);
    }
}
