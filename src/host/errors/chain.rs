//! A host error text read as the chain of errors it prints, in either of the shapes
//! policy-server writes (anyhow's multi-line debug form up to 1.37, one line from 1.38): what
//! `errors` reads the registry's words and the causes from. Separate because it is the one
//! part that knows the shapes, not what any text means.

use super::one_line;

/// The most `": "`-separated segments of a one-line text searched for its repeated causes: a
/// host's chain has a handful; a longer text is read as one error.
const CHAIN_SEGMENTS_MAX: usize = 64;

/// A host error text read as the chain of errors it prints, in either shape the host writes:
///
/// - up to policy-server 1.37, anyhow's debug form (`{e:?}`): the first error, a blank line,
///   then a `Caused by:` list, one cause a line (numbered when there are several);
/// - from 1.38, the callback handler's caches rewrap every failure as `anyhow!("{e:#}")`
///   (`try_cached` in viccuad/kubewarden-controller
///   `crates/policy-evaluator/src/callback_handler/cache_return.rs` @4f232f31, used by `oci.rs`
///   and `sigstore_verification.rs`), anyhow's alternate display: the same chain on one line,
///   each error followed by `": "` and its cause. The host then sends it as
///   `Callback evaluation failure: {e:?}` (`runtimes/callback.rs` @5d3bf086): a new error
///   with no causes, so only a backtrace may follow it.
///
/// The first error often ends with its cause's own words (policy-fetcher's
/// `Fail to interact with OCI registry: {cause}`), and a cause the head already ends with adds
/// nothing: it is dropped in both shapes. In the one-line shape that repetition is also the only
/// sign of where the first error ends; a text without one is read as a single error.
pub(super) struct Chain<'a> {
    /// The first error.
    pub(super) head: &'a str,
    /// What the causes add to it, split where the one-line shape joins errors (`": "`), so that
    /// both shapes give the same list.
    causes: Vec<String>,
}

impl<'a> Chain<'a> {
    /// Reads `text`, the host's prefixes already removed; a backtrace is cut.
    pub(super) fn read(text: &'a str) -> Chain<'a> {
        // The backtrace is for the host's developers, never for a kubectl user. kwctl records
        // only an error's first line, so under RUST_BACKTRACE=1 the backtrace may follow it
        // directly: cut the blank line before it too. Only line ends are trimmed: an empty
        // last message (`..., message: `) keeps its space, as the one-line shape repeats it.
        let text = text
            .find("\nStack backtrace:")
            .map_or(text, |end| &text[..end])
            .trim_end_matches(['\n', '\r']);
        let Some(at) = text.find("\n\nCaused by:") else {
            return Self::from_one_line(text);
        };
        let head = &text[..at];
        let shown = one_line(head);
        let causes: Vec<String> = cause_lines(&text[at + "\n\nCaused by:".len()..])
            .into_iter()
            .skip_while(|cause| ends_with_error(&shown, cause))
            .collect();
        let causes = causes.join(": ");
        Chain {
            head,
            causes: if causes.is_empty() {
                Vec::new()
            } else {
                causes.split(": ").map(str::to_string).collect()
            },
        }
    }

    /// The one-line shape: the first error ends where the text goes on with the words it ends
    /// with (its cause); causes that repeat the end of the first error are dropped too.
    fn from_one_line(text: &'a str) -> Chain<'a> {
        let mut starts = vec![0];
        starts.extend(text.match_indices(": ").map(|(at, _)| at + 2));
        let n = starts.len();
        if n > CHAIN_SEGMENTS_MAX {
            return Chain {
                head: text,
                causes: Vec::new(),
            };
        }
        // Segments `from..to`, joined as they stand in the text.
        let run = |from: usize, to: usize| -> &'a str {
            let end = if to < n { starts[to] - 2 } else { text.len() };
            &text[starts[from]..end]
        };
        // The longest run of the head's last segments that the text repeats from `at`.
        let repeated_at = |head_end: usize, at: usize| -> Option<usize> {
            (0..head_end)
                .map(|from| head_end - from)
                .find(|len| at + len <= n && run(head_end - len, head_end) == run(at, at + len))
        };
        for head_end in 1..n {
            let Some(len) = repeated_at(head_end, head_end) else {
                continue;
            };
            let mut next = head_end + len;
            while let Some(len) = repeated_at(head_end, next) {
                next += len;
            }
            return Chain {
                head: run(0, head_end),
                causes: (next..n).map(|i| one_line(run(i, i + 1))).collect(),
            };
        }
        Chain {
            head: text,
            causes: Vec::new(),
        }
    }

    /// The causes on one line, without the HTTP client's wrappers (the root cause is what a
    /// person acts on); none when the head says it all.
    pub(super) fn causes(&self) -> Option<String> {
        let last = self.causes.len().checked_sub(1)?;
        let kept: Vec<&str> = self
            .causes
            .iter()
            .enumerate()
            .filter(|(i, cause)| *i == last || !is_client_wrapper(cause))
            .map(|(_, cause)| cause.as_str())
            .collect();
        Some(kept.join(": "))
    }
}

/// Whether `head` is `cause`, or ends with it as a whole error (after `": "`).
fn ends_with_error(head: &str, cause: &str) -> bool {
    head == cause
        || head
            .strip_suffix(cause)
            .is_some_and(|before| before.ends_with(": "))
}

/// The words the host's HTTP client puts between a request and its root cause: hyper-util's
/// legacy client error (`client error (Connect)`, `client error (SendRequest)`: its `Display`
/// is `"client error ({:?})"` of the kind, hyperium/hyper-util `src/client/legacy/client.rs`)
/// and its connector's steps (`ConnectError`'s messages: `tcp connect error`, `dns error`,
/// `tcp open error`, `tcp bind local error`, ..., `src/client/legacy/connect/http.rs`).
fn is_client_wrapper(cause: &str) -> bool {
    let kind = cause
        .strip_prefix("client error (")
        .and_then(|rest| rest.strip_suffix(')'));
    if let Some(kind) = kind {
        return !kind.is_empty() && kind.bytes().all(|b| b.is_ascii_alphanumeric());
    }
    cause == "dns error"
        || cause.strip_prefix("tcp ").is_some_and(|step| {
            step.strip_suffix(" error").is_some_and(|step| {
                !step.is_empty()
                    && step
                        .bytes()
                        .all(|b| b.is_ascii_lowercase() || b == b' ' || b == b'_')
            })
        })
}

/// The entries of anyhow's `Caused by:` list: `    cause` for one, `    N: cause` for several.
fn cause_lines(list: &str) -> Vec<String> {
    list.lines()
        .map(str::trim)
        .filter(|line| !line.is_empty())
        .map(|line| match line.split_once(": ") {
            Some((n, rest)) if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) => rest,
            _ => line,
        })
        .map(one_line)
        .collect()
}
