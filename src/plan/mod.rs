//! The plan of copies: what the mirror lacks and the copies that fill it, in the one form the
//! policy writes and the fill controller (`fill-mirror`) reads. A room of its own because two
//! programs share it; it uses `decide`'s routing, and `pod` (the admission) uses it.

pub(crate) mod copies;
pub mod fill;
pub(crate) mod unmirrored;
pub(crate) mod warm;

pub use copies::COPY_COMMAND;
pub use fill::{
    Copy, FillEntry, FillRecord, copies_in_message, copy_for, marking_patch, pod_key, read_record,
    report_copy_problem, write_record,
};
pub use unmirrored::{UNMIRRORED_ANNOTATION, UNMIRRORED_LABEL};
pub use warm::Warm;
