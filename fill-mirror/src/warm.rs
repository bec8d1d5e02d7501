//! Warming a pull-through cache: a target that fills itself from its upstream when asked, and
//! cannot be pushed to, is filled by pulling the image through it as a node would, in the form
//! the cache fills on (`Warm`, from the policy crate's routing: ECR's cache fills on a tag),
//! streaming every manifest and blob of the nodes' platforms and discarding the bytes, each
//! checked against its digest (`warm/pull.rs`). Nothing is written to disk and memory stays a
//! few buffers per blob, whatever the image's size. A pinned source must be what the cache
//! holds: when its tag names other content now (moved upstream), the pinned digest is pulled
//! too, and refused when the cache has it not, since nothing here can put it there.

mod answers;
mod pull;

use std::time::Duration;

use image_swapper_policy::plan::Copy;
use image_swapper_policy::plan::Warm;
use image_swapper_policy::reference::Reference;

use crate::board::Outcome;
use crate::platforms::{Known, Nodes};
use crate::registry_http::RegistryHttp;
use answers::Failure;
use pull::Pull;

#[derive(Clone)]
pub struct Warmer {
    http: RegistryHttp,
    nodes: Nodes,
    /// How long one warming may take, both pulls together (`--copy-timeout`).
    timeout: Duration,
}

impl std::fmt::Debug for Warmer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Warmer")
            .field("timeout", &self.timeout)
            .finish()
    }
}

impl Warmer {
    pub fn new(http: RegistryHttp, nodes: Nodes, timeout: Duration) -> Warmer {
        Warmer {
            http,
            nodes,
            timeout,
        }
    }

    /// What the nodes run, as a warming reads it now.
    pub async fn known(&self) -> Known {
        self.nodes.known().await
    }

    /// Fills the pull-through cache of `copy`'s destination with its source: a pull of
    /// `warm.reference` through the cache, then of the pinned digest when the tag names other
    /// content now.
    pub async fn warm(&self, copy: &Copy, warm: &Warm) -> Outcome {
        let known = self.known().await;
        match tokio::time::timeout(self.timeout, self.pulls(warm, &known)).await {
            Ok(outcome) => outcome,
            Err(_) => Outcome::Failed(through(
                &warm.reference,
                &format!(
                    "the warming of {} took longer than {:?}",
                    copy.source, self.timeout
                ),
            )),
        }
    }

    async fn pulls(&self, warm: &Warm, known: &Known) -> Outcome {
        let reference = match Reference::parse(&warm.reference) {
            Ok(reference) => reference,
            Err(error) => {
                return Outcome::Failed(through(&warm.reference, &error.to_string()));
            }
        };
        let pull = Pull::new(&self.http, &reference, known);
        // By digest when the reference has one: what a node pulls.
        let asked = reference
            .digest()
            .or(reference.tag())
            .unwrap_or("latest")
            .to_string();
        let held = match pull.image(&asked).await {
            Ok(Some(digest)) => digest,
            Ok(None) => {
                return Outcome::Gone(through(
                    &warm.reference,
                    "has no such image, and its upstream gave it none",
                ));
            }
            Err(failure) => return failed(&warm.reference, failure),
        };
        let Some(pinned) = warm.digest.as_deref().filter(|pinned| *pinned != held) else {
            pull.done(&warm.reference);
            return Outcome::Copied;
        };
        let by_digest = format!("{}@{pinned}", reference.name());
        match pull.image(pinned).await {
            Ok(Some(_)) => {
                pull.done(&by_digest);
                Outcome::Copied
            }
            Ok(None) => Outcome::Refused(through(
                &warm.reference,
                &format!(
                    "names {held} now, and the cache lacks the pinned {pinned}: a pull-through cache fills on its upstream's tag, so only a rollout to the new digest is served from it"
                ),
            )),
            Err(failure) => failed(&by_digest, failure),
        }
    }
}

/// The words of an outcome, naming what the cache was asked for.
fn through(image: &str, words: &str) -> String {
    format!("the pull-through cache, asked for {image}: {words}")
}

fn failed(image: &str, failure: Failure) -> Outcome {
    match failure {
        Failure::Throttled(words, retry_after) => {
            Outcome::Throttled(through(image, &words), retry_after)
        }
        Failure::Failed(words) => Outcome::Failed(through(image, &words)),
    }
}
