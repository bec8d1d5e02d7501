//! What an admission answers the API server: the verdict, the warnings for kubectl, and the
//! audit annotations. Apart from the steps because every step's answer is one.

use std::collections::BTreeMap;

use serde_json::Value;

/// What to answer the API server.
#[derive(Debug, PartialEq)]
pub struct Outcome {
    pub verdict: Verdict,
    /// For the user (kubectl prints them).
    pub warnings: Vec<String>,
    /// For the API server's audit log: keys are name parts the API server prefixes with the
    /// webhook's name; values are JSON text.
    pub audit: BTreeMap<String, String>,
}

#[derive(Debug, PartialEq)]
pub enum Verdict {
    Accept,
    Mutate(Value),
    /// Refused for what the policy found (the audit scanner's `fail`).
    Reject(String),
    /// Refused because the policy could not find out (code 500: the audit scanner's `error`).
    Error(String),
}

impl Outcome {
    /// Accepted, unchanged, nothing to say.
    pub fn unchanged() -> Outcome {
        Outcome::of(Verdict::Accept)
    }

    /// `verdict`, with nothing more to say.
    pub fn of(verdict: Verdict) -> Outcome {
        Outcome {
            verdict,
            warnings: Vec::new(),
            audit: BTreeMap::new(),
        }
    }
}
