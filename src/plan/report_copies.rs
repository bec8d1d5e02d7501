//! The copies a check role's report names: read out of its message, and run only when each is
//! what the check role writes under the settings, since anyone who can write a report can write
//! its message.

use crate::decide::images::source_image;
use crate::policy::Policy;

use super::copies::COPY_COMMAND;
use super::copy::Copy;

/// The copies a check role's result message names, in order: each [`COPY_COMMAND`] followed by
/// `docker://SOURCE docker://DESTINATION`, both ending at the first character outside the
/// reference grammar (the check role writes them inside parentheses and sentences).
pub fn copies_in_message(message: &str) -> Vec<Copy> {
    let grammar = |b: u8| b.is_ascii_alphanumeric() || b"._:@/-".contains(&b);
    let reference = |text: &str| -> Option<(String, usize)> {
        let rest = text.strip_prefix("docker://")?;
        let end = rest.bytes().position(|b| !grammar(b)).unwrap_or(rest.len());
        (end > 0).then(|| (rest[..end].to_string(), "docker://".len() + end))
    };
    let mut copies = Vec::new();
    let mut rest = message;
    while let Some(at) = rest.find(COPY_COMMAND) {
        rest = &rest[at + COPY_COMMAND.len()..];
        let Some(after) = rest.strip_prefix(' ') else {
            continue;
        };
        let Some((source, used)) = reference(after) else {
            continue;
        };
        let Some(after_source) = after[used..].strip_prefix(' ') else {
            continue;
        };
        let Some((destination, _)) = reference(after_source) else {
            continue;
        };
        copies.push(Copy {
            source,
            destination,
            warm: None,
        });
    }
    copies
}

/// Why a copy a report names is not one the policy writes under `policy`, or `None` when it
/// is. A report's result can be written by anyone who can write reports, so its copy runs only
/// when it is what the check role writes: the source a reference a rule routes to a mirror (not
/// excluded, not a mirror image), in its normal form; the destination one of that rule's target
/// repositories with a tag: the digest's own tag (`sha256-<hex>`) for a copy by digest, the same
/// tag for a copy by tag (a signature's `sha256-<hex>.sig` is a tag). So a copy never moves a
/// tag to other content, and never lands where the rules do not route its source.
pub fn report_copy_problem(copy: &Copy, policy: &Policy) -> Option<String> {
    let Some(source) = source_image(&copy.source, policy) else {
        return Some(format!(
            "no rule of the settings routes {} to a mirror (unmatched, excluded, or a mirror image itself)",
            copy.source
        ));
    };
    if source.source != copy.source {
        return Some(format!(
            "its source {} is not in the form the policy writes ({})",
            copy.source, source.source
        ));
    }
    let split = copy
        .destination
        .rsplit_once(':')
        .filter(|(repository, tag)| !tag.contains('/') && !repository.contains('@'));
    let Some((repository, tag)) = split else {
        return Some(format!(
            "its destination {} is not a repository and a tag",
            copy.destination
        ));
    };
    let repositories: Vec<&str> = source.targets.iter().map(|t| t.repository()).collect();
    if !repositories.contains(&repository) {
        return Some(format!(
            "the settings route {} to {}, not {repository}",
            source.name,
            repositories.join(" or ")
        ));
    }
    let wanted = match source.targets.first().and_then(|t| t.digest()) {
        Some(digest) => digest.replacen(':', "-", 1),
        None => source.source[source.name.len()..]
            .trim_start_matches(':')
            .to_string(),
    };
    (tag != wanted).then(|| {
        let by = if source.targets.first().and_then(|t| t.digest()).is_some() {
            "a copy by digest goes to the digest's own tag"
        } else {
            "a copy by tag goes to the same tag"
        };
        format!("{by} {wanted}, not {tag}")
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::tests::policy_from;

    const SETTINGS: &str = r#"{"mirrors":[
        {"source":"docker.io","targets":[{"target":"m.io/hub"},{"target":"us.m.io/hub"}]}],
        "exclude":["docker.io/library/busybox:*"]}"#;

    /// The copies a message names, as the check role writes them in sentences and parentheses;
    /// a command that is not the policy's form is not read.
    #[test]
    fn copies_are_read_out_of_a_message_as_the_check_role_writes_them() {
        let message = "containers \"web\": image \"m.io/hub/app:1@sha256:aa\" is not in the mirror: it was swapped from \"app:1\": refill the mirror (skopeo copy --all --preserve-digests docker://docker.io/library/app@sha256:aa docker://m.io/hub/library/app:sha256-aa) or roll out; skopeo copy --all docker://x docker://y; skopeo copy --all --preserve-digests docker://docker.io/library/web:2 docker://m.io/hub/library/web:2; roll out.";
        let copies: Vec<String> = copies_in_message(message)
            .iter()
            .map(Copy::to_string)
            .collect();
        assert_eq!(
            copies,
            [
                "docker.io/library/app@sha256:aa m.io/hub/library/app:sha256-aa",
                "docker.io/library/web:2 m.io/hub/library/web:2",
            ]
        );
    }

    /// A report's copy runs only when it is what the check role writes for its source.
    #[rstest::rstest]
    #[case::by_tag("docker.io/library/web:2", "m.io/hub/library/web:2", None)]
    #[case::to_the_second_target("docker.io/library/web:2", "us.m.io/hub/library/web:2", None)]
    #[case::by_digest_to_its_own_tag(
        "docker.io/library/web@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
        "m.io/hub/library/web:sha256-0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
        None
    )]
    #[case::a_signature_tag(
        "docker.io/library/web:sha256-0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef.sig",
        "m.io/hub/library/web:sha256-0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef.sig",
        None
    )]
    #[case::a_moved_tag(
        "docker.io/library/web:2",
        "m.io/hub/library/web:3",
        Some("a copy by tag goes to the same tag 2, not 3")
    )]
    #[case::a_digest_over_a_tag(
        "docker.io/library/web@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
        "m.io/hub/library/web:2",
        Some(
            "a copy by digest goes to the digest's own tag sha256-0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef, not 2"
        )
    )]
    #[case::elsewhere(
        "docker.io/library/web:2",
        "evil.io/library/web:2",
        Some(
            "the settings route docker.io/library/web to m.io/hub/library/web or us.m.io/hub/library/web, not evil.io/library/web"
        )
    )]
    #[case::excluded(
        "docker.io/library/busybox:1",
        "m.io/hub/library/busybox:1",
        Some(
            "no rule of the settings routes docker.io/library/busybox:1 to a mirror (unmatched, excluded, or a mirror image itself)"
        )
    )]
    #[case::not_normal(
        "web:2",
        "m.io/hub/library/web:2",
        Some("its source web:2 is not in the form the policy writes (docker.io/library/web:2)")
    )]
    #[case::no_tag(
        "docker.io/library/web:2",
        "m.io/hub/library/web@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
        Some(
            "its destination m.io/hub/library/web@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef is not a repository and a tag"
        )
    )]
    fn a_report_s_copy_is_checked_as_the_policy_writes_it(
        #[case] source: &str,
        #[case] destination: &str,
        #[case] problem: Option<&str>,
    ) {
        let policy = policy_from(SETTINGS);
        let copy = Copy {
            source: source.to_string(),
            destination: destination.to_string(),
            warm: None,
        };
        assert_eq!(
            report_copy_problem(&copy, &policy).as_deref(),
            problem,
            "{copy}"
        );
    }
}
