//! What a copy attempt ends in, what became of each copy, and the backoff's bounds: the
//! board's vocabulary, shared with the copy engines and the runner.

use std::time::{Duration, Instant, SystemTime};

use image_swapper_policy::plan::Copy;

/// What a copy attempt ended in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Copied now.
    Copied,
    /// The destination exists already: never copied over (that could move a tag).
    Present,
    /// The source registry says it has no such image: the registry's words.
    Gone(String),
    /// The source registry answered 429 or 5xx: its words, and its `Retry-After` when given.
    Throttled(String, Option<Duration>),
    /// Anything else: the words.
    Failed(String),
    /// Not copied on purpose, for good (a signature of a digest the source's tag no longer
    /// names): why, naming both digests.
    Refused(String),
}

impl Outcome {
    /// The `result` label of `fill_mirror_copies_total`.
    pub fn label(&self) -> &'static str {
        match self {
            Outcome::Copied => "copied",
            Outcome::Present => "present",
            Outcome::Gone(_) => "gone",
            Outcome::Throttled(..) | Outcome::Failed(_) => "failed",
            Outcome::Refused(_) => "refused",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Status {
    Queued,
    Running,
    /// The mirror holds it since then.
    Done(SystemTime),
    /// The source has none, or the copy was refused: not tried again until asked again.
    Gone,
    /// Failed, and not tried again (the one-shot run).
    Failed,
}

#[derive(Clone, Debug)]
pub struct CopyItem {
    pub copy: Copy,
    /// For the copy of a signature a record names: the image it signs, as the source names it
    /// (by tag, or pinned), so that the copy can be refused when that tag has moved on.
    pub signs: Option<String>,
    pub status: Status,
    /// When the first Pod that asks for it was recorded: the start of `time_to_mirror`.
    pub asked: SystemTime,
    /// Not before then (its own backoff after a failure).
    pub(super) not_before: Option<Instant>,
    pub(super) delay: Option<Duration>,
}

/// The backoff's bounds: a failed copy waits `retry` first, doubled at each failure up to
/// `max`.
#[derive(Clone, Copy, Debug)]
pub struct Backoff {
    pub retry: Duration,
    pub max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            retry: Duration::from_secs(10),
            max: Duration::from_secs(300),
        }
    }
}

impl Backoff {
    pub(super) fn next(&self, previous: Option<Duration>) -> Duration {
        previous.map_or(self.retry, |d| (d * 2).min(self.max))
    }
}
