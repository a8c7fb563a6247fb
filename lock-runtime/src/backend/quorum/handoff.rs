//! The in-process hand-off over a quorum (design §13, "In-process hand-off
//! over a quorum"): the lock goes from one holder of this client to the
//! next with one `quorum_handoff.lua` on every node, held by the next
//! holder once a majority swapped the passing holder's value for its own.

use std::sync::Arc;
use std::time::Duration;

use futures_util::stream::{FuturesUnordered, StreamExt};
use tokio::time::Instant;

use super::attempt::{undecided, unreachable};
use super::nodes::{answered, Silence};
use super::QuorumBackend;
use crate::backend::{Found, Pass};
use crate::error::LockError;
use crate::keys::LockKeys;

impl QuorumBackend {
    /// Passes the lock from the value `token` to the value `next` on every
    /// node, settled as a release is: as soon as a majority passed it (the
    /// next holder holds it there, from the send on) or a majority no
    /// longer held `token` (refused); a stopped node does not hold it up and
    /// is heard out in the background. Too few answers to tell is an error:
    /// the outcome is open (either value may be in the keys).
    pub(super) async fn pass_to_next(
        &self,
        keys: &LockKeys,
        token: &str,
        next: &str,
        ttl_ms: u64,
    ) -> Result<Pass, LockError> {
        let sent_at = Instant::now();
        let shared = Arc::new((keys.clone(), token.to_owned(), next.to_owned()));
        let deadline = self.deadline;
        let mut passes: FuturesUnordered<_> = (0..self.nodes.len())
            .map(|i| {
                let (nodes, shared) = (Arc::clone(&self.nodes), Arc::clone(&shared));
                async move {
                    let (keys, token, next) = &*shared;
                    // Bounded by the call's own deadline (`Connection::call`).
                    if let Some(refused) = nodes[i].refusing(keys.name(), "pass") {
                        nodes[i].saw(Some(false));
                        return (i, Err(refused));
                    }
                    let answer = nodes[i].redis.pass_on_node(keys, token, next, ttl_ms).await;
                    nodes[i].after(&answer);
                    nodes[i].saw(Some(answered(&answer)));
                    (i, answer)
                }
            })
            .collect();
        let (quorum, nodes) = (self.nodes.quorum(), self.nodes.len());
        let (mut passed, mut not, mut other, mut queued) = (0, 0, false, false);
        let mut failed: Vec<(usize, Silence)> = Vec::new();
        let mut heard = vec![false; nodes];
        while let Some((node, answer)) = passes.next().await {
            heard[node] = true;
            match answer {
                Ok(Pass::Passed { queued: here, .. }) => {
                    passed += 1;
                    queued |= here;
                }
                Ok(Pass::Refused(found)) => {
                    not += 1;
                    other |= found == Found::Other;
                }
                Err(error) => failed.push((node, Silence::Failed(error))),
            }
            if passed >= quorum || not > nodes - quorum {
                break;
            }
        }
        let carried = passed >= quorum || not > nodes - quorum;
        if carried && !passes.is_empty() {
            // The others are heard out in the background (their health
            // noted); the next holder does not wait for them.
            let nodes = Arc::clone(&self.nodes);
            tokio::spawn(async move {
                while let Some((node, answer)) = passes.next().await {
                    if answer.is_err() {
                        nodes.failed(node, "hand-off");
                    }
                }
            });
        }
        if carried {
            for (node, _) in &failed {
                self.nodes.failed(*node, "hand-off");
            }
        }
        if passed >= quorum {
            return Ok(Pass::Passed {
                fence: None,
                queued,
            });
        }
        if not > nodes - quorum {
            return Ok(Pass::Refused(if other {
                Found::Other
            } else {
                Found::Gone
            }));
        }
        let answers = passed + not;
        let mut silent = failed;
        silent.extend(
            (0..nodes)
                .filter(|&node| !heard[node])
                .map(|node| (node, Silence::NoAnswer(elapsed_or(sent_at, deadline)))),
        );
        if answers < quorum {
            return Err(unreachable(&self.nodes, keys, "hand-off", answers, silent));
        }
        Err(undecided(&self.nodes, keys, passed, not, silent))
    }
}

/// How long a node that never answered was given.
fn elapsed_or(sent_at: Instant, deadline: Duration) -> Duration {
    sent_at.elapsed().min(deadline)
}
