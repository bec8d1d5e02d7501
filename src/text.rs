//! Strings for people: an image quoted for a message, and any text cut to a bounded length.
//! Shared by the decisions, the host's error reading and the report, so that every message and
//! audit value is bounded the same way.

/// The longest image string quoted in a message; Kubernetes truncates long warnings anyway.
const QUOTE_MAX: usize = 200;

/// An image string for a message: quoted, escaped, and cut to a readable length.
pub fn quote(image: &str) -> String {
    let (kept, cut) = cut_at(image, QUOTE_MAX);
    if cut {
        format!("{kept:?}…")
    } else {
        format!("{kept:?}")
    }
}

/// `text` cut to at most `max` characters, marked with `…` when cut: messages and audit
/// values stay bounded whatever the request or the host sent.
pub fn truncated(text: &str, max: usize) -> String {
    match cut_at(text, max) {
        (kept, true) => format!("{kept}…"),
        (kept, false) => kept.to_string(),
    }
}

/// The first `max` characters of `text`, and whether anything was cut.
fn cut_at(text: &str, max: usize) -> (&str, bool) {
    match text.char_indices().nth(max) {
        Some((at, _)) => (&text[..at], true),
        None => (text, false),
    }
}
