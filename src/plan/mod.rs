//! The plan of copies: what the mirror lacks and the copies that fill it, in the one form the
//! policy writes and the fill controller (`fill-mirror`) reads. A room of its own because two
//! programs share it; it uses `decide`'s routing, and `pod` (the admission) uses it.

pub(crate) mod copies;
mod copy;
mod fill;
mod report_copies;
pub(crate) mod unmirrored;
mod warm;

pub use copies::COPY_COMMAND;
pub use copy::{Copy, copy_for};
pub use fill::{FillEntry, FillRecord, marking_patch, pod_key, read_record, write_record};
pub use report_copies::{copies_in_message, report_copy_problem};
pub use unmirrored::{UNMIRRORED_ANNOTATION, UNMIRRORED_LABEL};
pub use warm::Warm;
