//! Which Pods' records can be marked filled, and how a mark patch ended.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use image_swapper_policy::plan::Copy;

use super::{Board, Status, whole_seconds};

/// A Pod whose record has entries the mirror now holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mark {
    pub pod: String,
    pub text: String,
    pub filled: Vec<String>,
}

/// How a mark patch ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MarkResult {
    Marked,
    /// The record changed since it was read (the patch's `test` failed) or the Pod is gone:
    /// read again at its next event.
    Final,
    /// The API server could not take it now (429, 5xx, a timeout): again later.
    Retry,
}

impl Board {
    /// The Pods whose entries the mirror now holds (the image's copy, and its signature's when
    /// the entry names one), made at or after the Pod's record; none that waits for a retry or
    /// whose record was refused a mark as it is.
    pub fn marks(&self, now: Instant) -> Vec<Mark> {
        self.pods
            .iter()
            .filter(|(_, pod)| pod.retry_at.is_none_or(|at| at <= now))
            .filter(|(_, pod)| pod.refused_text.as_deref() != Some(pod.record.text.as_str()))
            .filter_map(|(key, pod)| {
                let holds = |copy: &Copy| {
                    self.copies.get(&copy.destination).is_some_and(|item| {
                        matches!(item.status, Status::Done(made)
                        if pod.created.is_none_or(|c| whole_seconds(c) <= whole_seconds(made)))
                    })
                };
                let filled: Vec<String> = pod
                    .record
                    .entries
                    .iter()
                    .filter(|e| holds(&e.copy) && e.signature.as_ref().is_none_or(holds))
                    .map(|e| e.container.clone())
                    .collect();
                (!filled.is_empty()).then(|| Mark {
                    pod: key.clone(),
                    text: pod.record.text.clone(),
                    filled,
                })
            })
            .collect()
    }

    /// Records how a mark ended.
    pub fn marked(&mut self, mark: &Mark, result: MarkResult, now: Instant) {
        let Some(pod) = self.pods.get_mut(&mark.pod) else {
            return;
        };
        if pod.record.text != mark.text {
            return;
        }
        match result {
            MarkResult::Marked => {
                // Its next event says what is left of the record.
                let filled: BTreeSet<&str> = mark.filled.iter().map(String::as_str).collect();
                pod.record
                    .entries
                    .retain(|e| !filled.contains(e.container.as_str()));
                if pod.record.entries.is_empty() {
                    self.pods.remove(&mark.pod);
                } else {
                    pod.refused_text = Some(mark.text.clone());
                }
            }
            MarkResult::Final => pod.refused_text = Some(mark.text.clone()),
            MarkResult::Retry => {
                let delay = pod.retry_delay.map_or(Duration::from_secs(5), |d| {
                    (d * 2).min(Duration::from_secs(60))
                });
                pod.retry_delay = Some(delay);
                pod.retry_at = Some(now + delay);
            }
        }
    }
}
