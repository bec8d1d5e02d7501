//! `exclude` patterns: `*` matches any run of characters (`/` and `:` included), `?` matches one
//! character, everything else matches itself. Matched by hand, because a regular expression would
//! be compiled again at every admission.

use std::fmt;

/// Characters that other glob dialects give a meaning; refusing them keeps a pattern written for
/// those dialects from silently matching nothing.
const RESERVED: [char; 5] = ['[', ']', '{', '}', '\\'];

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Glob(String);

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GlobError {
    Empty,
    Whitespace,
    Reserved(char),
}

impl fmt::Display for GlobError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GlobError::Empty => f.write_str("a pattern cannot be empty"),
            GlobError::Whitespace => {
                f.write_str("a pattern cannot contain white space or control characters")
            }
            GlobError::Reserved(c) => write!(f, "'{c}' is not supported, use '*' and '?' only"),
        }
    }
}

impl Glob {
    pub fn new(pattern: &str) -> Result<Glob, GlobError> {
        if pattern.is_empty() {
            return Err(GlobError::Empty);
        }
        if pattern.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(GlobError::Whitespace);
        }
        if let Some(c) = pattern.chars().find(|c| RESERVED.contains(c)) {
            return Err(GlobError::Reserved(c));
        }
        Ok(Glob(pattern.to_string()))
    }

    /// A pattern as `wildmatch` reads it (verify-image-signatures' rules): `*` and `?`, every
    /// other character itself, nothing refused. For the rules read from verifiers, which must
    /// be matched as their verifier matches them.
    pub fn wildmatch(pattern: &str) -> Glob {
        Glob(pattern.to_string())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Iterative matching with one backtrack point: linear for patterns with one `*`, and at
    /// worst O(pattern × text), never exponential. Bytes when both are ASCII (no allocation),
    /// characters otherwise, so that `?` is always one character.
    pub fn matches(&self, text: &str) -> bool {
        if self.0.is_ascii() && text.is_ascii() {
            matches_slice(self.0.as_bytes(), text.as_bytes(), b'*', b'?')
        } else {
            let pattern: Vec<char> = self.0.chars().collect();
            let text: Vec<char> = text.chars().collect();
            matches_slice(&pattern, &text, '*', '?')
        }
    }
}

fn matches_slice<T: Copy + PartialEq>(pattern: &[T], text: &[T], star: T, any: T) -> bool {
    let (mut p, mut t) = (0, 0);
    let mut backtrack: Option<(usize, usize)> = None;
    while t < text.len() {
        match pattern.get(p) {
            Some(&c) if c == star => {
                backtrack = Some((p, t));
                p += 1;
            }
            Some(&c) if c == any || c == text[t] => {
                p += 1;
                t += 1;
            }
            _ => match backtrack {
                Some((star_at, star_t)) => {
                    p = star_at + 1;
                    t = star_t + 1;
                    backtrack = Some((star_at, star_t + 1));
                }
                None => return false,
            },
        }
    }
    pattern[p..].iter().all(|&c| c == star)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    #[rstest]
    #[case::any_tag("registry.k8s.io/pause:*", "registry.k8s.io/pause:3.9", true)]
    #[case::other_image("registry.k8s.io/pause:*", "registry.k8s.io/pause2:3.9", false)]
    #[case::star_crosses_slashes("docker.io/*", "docker.io/library/nginx:1.27", true)]
    #[case::question_mark("quay.io/app:v?", "quay.io/app:v1", true)]
    #[case::question_mark_one_char("quay.io/app:v?", "quay.io/app:v10", false)]
    #[case::literal("docker.io/library/nginx:1.27", "docker.io/library/nginx:1.27", true)]
    #[case::literal_prefix_is_not_a_match(
        "docker.io/library/nginx",
        "docker.io/library/nginx:1.27",
        false
    )]
    #[case::several_stars("*/library/*:1.*", "docker.io/library/nginx:1.27", true)]
    #[case::backtracking("*a*b", "xaxxaxb", true)]
    #[case::trailing_stars("nginx**", "nginx", true)]
    #[case::unicode("caf?", "café", true)]
    fn matches_whole_references(#[case] pattern: &str, #[case] text: &str, #[case] expected: bool) {
        let glob = Glob::new(pattern).expect("valid pattern");
        assert_eq!(glob.matches(text), expected);
    }

    #[rstest]
    #[case::empty("", GlobError::Empty)]
    #[case::space("nginx *", GlobError::Whitespace)]
    #[case::class("nginx:[0-9]", GlobError::Reserved('['))]
    #[case::alternation("{a,b}", GlobError::Reserved('{'))]
    #[case::escape("a\\*", GlobError::Reserved('\\'))]
    fn refuses_patterns_it_would_misread(#[case] pattern: &str, #[case] error: GlobError) {
        assert_eq!(Glob::new(pattern), Err(error));
    }

    /// Every pattern and text of up to 4 characters over `a`, `/`, `:`, `*`, `?` (texts
    /// without the two wildcards, plus one non-ASCII letter): a rule read from a verifier
    /// matches exactly the images `wildmatch` 2.6, the crate verify-image-signatures matches
    /// them with (its src/lib.rs), matches. The oracle is that crate, not this matcher.
    #[test]
    fn a_verifier_s_rule_matches_as_wildmatch_does() {
        fn words(alphabet: &[char], longest: usize) -> Vec<String> {
            let mut all = vec![String::new()];
            let mut last = vec![String::new()];
            for _ in 0..longest {
                last = last
                    .iter()
                    .flat_map(|word| alphabet.iter().map(move |c| format!("{word}{c}")))
                    .collect();
                all.extend(last.iter().cloned());
            }
            all
        }
        let patterns = words(&['a', '/', ':', '*', '?'], 4);
        let texts = words(&['a', '/', ':', 'é'], 4);
        let mut differences = Vec::new();
        for pattern in &patterns {
            let ours = Glob::wildmatch(pattern);
            let theirs = wildmatch::WildMatch::new(pattern);
            for text in &texts {
                if ours.matches(text) != theirs.matches(text) {
                    differences.push(format!("{pattern:?} on {text:?}"));
                }
            }
        }
        assert!(
            differences.is_empty(),
            "{} differ from wildmatch, the first: {:?}",
            differences.len(),
            &differences[..differences.len().min(4)]
        );
    }

    #[test]
    fn pathological_pattern_stays_fast() {
        let glob = Glob::new(&"*a".repeat(50)).expect("valid pattern");
        assert!(!glob.matches(&"a".repeat(49)));
        assert!(glob.matches(&"a".repeat(5000)));
    }
}
