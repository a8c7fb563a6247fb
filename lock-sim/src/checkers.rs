//! The checkers: what a run's history must never show, by the library's
//! own account of its holds (design §9's guarantees).

use std::collections::BTreeMap;

use crate::history::{Call, Hold, Mode, Outcome, Recorder};
use crate::world::Micros;

/// A broken guarantee.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    pub kind: &'static str,
    pub text: String,
}

/// For a key: the nodes that serve it, and how many of them must answer.
pub type Serving = Box<dyn Fn(&str) -> (Vec<usize>, usize)>;

/// What the checkers know of the run besides its history.
pub struct Facts {
    /// Intervals in which writes may have been lost (excuse overlaps).
    pub lossy: Vec<(Micros, Micros)>,
    /// Each node's outages: down, stalled, or a replica (not serving locks).
    pub outages: BTreeMap<usize, Vec<(Micros, Micros)>>,
    /// Each client's pauses.
    pub pauses: BTreeMap<usize, Vec<(Micros, Micros)>>,
    /// For a key: the nodes that serve it, and how many must answer.
    pub serving: Serving,
    /// The longest one-way delay of a message.
    pub max_delay: Micros,
    pub healed: Micros,
    pub end: Micros,
    pub progress_bound: Micros,
    /// Keys left on the nodes after everyone finished and the ttls passed.
    pub leftovers: Vec<String>,
    /// Tasks that did not finish.
    pub hung: Vec<String>,
    /// Lock keys a renewal brought back where they were gone (when, node,
    /// key): read from the simulated nodes around each `RENEW`.
    pub renewal_created: Vec<(Micros, String, String)>,
    /// Sentinels' `+switch-master` announcements: (when, the node named).
    pub announced: Vec<(Micros, usize)>,
    /// Connections that stopped answering (a lost reply, a late request):
    /// (when, whose client). Nothing tells a client so until a call on the
    /// connection runs out its deadline.
    pub silenced: Vec<(Micros, usize)>,
    /// Switches of primary the clients learned of: (when, whose client,
    /// the lock names the switch concerns).
    pub learned: Vec<(Micros, usize, Vec<String>)>,
}

pub fn check(rec: &Recorder, facts: &Facts) -> Vec<Violation> {
    let mut violations = Vec::new();
    overlaps(rec, facts, &mut violations);
    fencing(rec, facts, &mut violations);
    bounds(rec, facts, &mut violations);
    wrong_kind(rec, facts, &mut violations);
    progress(rec, facts, &mut violations);
    starvation(rec, facts, &mut violations);
    starved_sets(rec, facts, &mut violations);
    fair_order(rec, facts, &mut violations);
    stuck_after_switch(rec, facts, &mut violations);
    held_back(rec, facts, &mut violations);
    expired_grants(rec, facts, &mut violations);
    for call in &rec.calls {
        if let Some(Outcome::Config(message)) = &call.outcome {
            violations.push(Violation {
                kind: "config-error",
                text: format!(
                    "call #{} ({}) failed with a configuration error: {message}",
                    call.id, call.op
                ),
            });
        }
    }
    if !facts.leftovers.is_empty() {
        violations.push(Violation {
            kind: "leftover",
            text: format!(
                "keys left after everyone finished and every ttl passed: {}",
                facts.leftovers.join(", ")
            ),
        });
    }
    // A released or expired lock is never extended again (design §5): a
    // renewal that finds its key gone reports the hold lost and brings
    // nothing back (the key may be another's by now on another node of a
    // quorum, or taken in the instant after).
    for (at, node, key) in &facts.renewal_created {
        violations.push(Violation {
            kind: "renewal-created",
            text: format!(
                "a renewal brought back {key} on {node} at {:.3} ms, where it was gone",
                *at as f64 / 1000.0
            ),
        });
    }
    for hung in &facts.hung {
        violations.push(Violation {
            kind: "hung",
            text: hung.clone(),
        });
    }
    violations
}

/// Whether the overlap of `a` and `b` is one the library allows: near a
/// window in which a failover or a restart may have lost writes (within a
/// second after it), unless the library's own account of failovers rules
/// it out (`told_in_time`).
fn excused(rec: &Recorder, facts: &Facts, a: &Hold, b: &Hold) -> bool {
    let (from, to) = (a.start.min(b.start), a.end.max(b.end));
    facts
        .lossy
        .iter()
        .filter(|&&(lost_from, lost_to)| lost_from <= to && lost_to + 1_000_000 >= from)
        .any(|&(lost_from, _)| !told_in_time(rec, facts, a, b, lost_from))
}

/// Whether the library's account of a failover leaves no room for `a` and
/// `b` to overlap after the one that began at `lost_from` (design §15):
/// when the holders' clients learned of a switch concerning the key close
/// enough together, the one whose lock the new primary lacks is told
/// (its renewal on the switch finds the key gone or another's: at most
/// half the hold-back, then a round trip) before the other's acquisition,
/// held back for `GRACE` after its client learned of the switch, is
/// granted. Both holds renewed (an unrenewed holder is never told), both
/// clients running before the failover (a client's first route is no
/// switch), neither paused nor with a connection that stopped answering
/// (its renewal may go unanswered).
fn told_in_time(rec: &Recorder, facts: &Facts, a: &Hold, b: &Hold, lost_from: Micros) -> bool {
    if !(a.renewed && b.renewed) {
        return false;
    }
    let overlap_to = a.end.min(b.end);
    let learned = |client: usize| {
        facts
            .learned
            .iter()
            .find(|(at, whose, names)| {
                *whose == client && *at >= lost_from && names.contains(&a.key)
            })
            .map(|(at, _, _)| *at)
    };
    let (Some(learned_a), Some(learned_b)) = (learned(a.client), learned(b.client)) else {
        return false;
    };
    let deadline = |hold: &Hold| rec.calls.get(hold.call).map_or(0, |call| call.deadline);
    let ran_before = |client: usize| {
        rec.calls
            .iter()
            .any(|call| call.client == client && call.start < lost_from)
    };
    let disturbed = |client: usize, deadline: Micros| {
        let paused = facts.pauses.get(&client).is_some_and(|pauses| {
            pauses
                .iter()
                .any(|&(from, to)| from < overlap_to && to + deadline > lost_from)
        });
        paused
            || facts.silenced.iter().any(|&(at, whose)| {
                whose == client && at < overlap_to && at + 2 * deadline > lost_from
            })
    };
    if !ran_before(a.client)
        || !ran_before(b.client)
        || disturbed(a.client, deadline(a))
        || disturbed(b.client, deadline(b))
    {
        return false;
    }
    let grace = (deadline(a).min(deadline(b)) / 2).min(500_000);
    let tell = grace / 2 + 4 * facts.max_delay + 20_000;
    (learned_a - learned_b).abs() + tell <= grace
}

/// A call, as violations name it: `call #id (cC.tT op keys)`.
fn call_text(call: &Call) -> String {
    format!(
        "call #{} (c{}.t{} {} {})",
        call.id,
        call.client,
        call.task,
        call.op,
        crate::history::keys_text(&call.keys)
    )
}

fn describe(hold: &Hold) -> String {
    format!(
        "#{} (c{}.t{}, {} [{:.3} ms, {:.3} ms), ended by {})",
        hold.call,
        hold.client,
        hold.task,
        hold.mode,
        hold.start as f64 / 1000.0,
        hold.end as f64 / 1000.0,
        hold.why_ended
    )
}

/// Two holders of a key whose validity windows overlap: exclusive; a
/// reader beside a writer; more than the permits of a semaphore.
fn overlaps(rec: &Recorder, facts: &Facts, violations: &mut Vec<Violation>) {
    let mut by_key: BTreeMap<&str, Vec<&Hold>> = BTreeMap::new();
    for hold in &rec.holds {
        if hold.end > hold.start {
            by_key.entry(&hold.key).or_default().push(hold);
        }
    }
    for (key, mut holds) in by_key {
        holds.sort_by_key(|hold| (hold.start, hold.call));
        let capacity = holds.iter().find_map(|hold| match hold.mode {
            Mode::Permits { capacity, .. } => Some(capacity),
            _ => None,
        });
        if let Some(capacity) = capacity {
            // A sweep: permits in use at each start.
            for (at, hold) in holds.iter().enumerate() {
                let beside: Vec<&&Hold> = holds[..at]
                    .iter()
                    .filter(|other| other.end > hold.start)
                    .collect();
                let used: u32 = beside
                    .iter()
                    .map(|other| match other.mode {
                        Mode::Permits { permits, .. } => permits,
                        _ => 0,
                    })
                    .sum::<u32>()
                    + match hold.mode {
                        Mode::Permits { permits, .. } => permits,
                        _ => 0,
                    };
                if used > capacity && !beside.iter().any(|other| excused(rec, facts, other, hold)) {
                    violations.push(Violation {
                        kind: "overlap",
                        text: format!(
                            "semaphore {key}: {used} permits of {capacity} held at {:.3} ms: {} beside {}",
                            hold.start as f64 / 1000.0,
                            describe(hold),
                            beside.iter().map(|other| describe(other)).collect::<Vec<_>>().join(", ")
                        ),
                    });
                }
            }
            continue;
        }
        for (at, a) in holds.iter().enumerate() {
            for b in &holds[at + 1..] {
                if b.start >= a.end {
                    continue;
                }
                let both_read = a.mode == Mode::Read && b.mode == Mode::Read;
                if both_read || excused(rec, facts, a, b) {
                    continue;
                }
                violations.push(Violation {
                    kind: "overlap",
                    text: format!("key {key}: {} and {} overlap", describe(a), describe(b)),
                });
            }
        }
    }
}

/// A fencing token not above every earlier one of its key.
///
/// Excused: a set's token written onto a key's fence from another
/// primary's clock, lost with that fence (a restart empty, a failover that
/// lost writes) before the key's next token: the key's own clock may be
/// behind the set's (design §16, "Fencing: one token for the set").
fn fencing(rec: &Recorder, facts: &Facts, violations: &mut Vec<Violation>) {
    let mut by_key: BTreeMap<&str, Vec<&crate::history::FenceUse>> = BTreeMap::new();
    for fence in &rec.fences {
        by_key.entry(&fence.key).or_default().push(fence);
    }
    for (key, uses) in by_key {
        for used in &uses {
            let Some(call_start) = used.call_start else {
                continue;
            };
            if let Some(earlier) = uses
                .iter()
                .filter(|earlier| earlier.at < call_start && earlier.token >= used.token)
                .filter(|earlier| {
                    let from_set = rec
                        .calls
                        .get(earlier.call)
                        .is_some_and(|call| call.keys.len() > 1);
                    let lost = facts
                        .lossy
                        .iter()
                        .any(|&(from, to)| from <= used.at && to >= earlier.at);
                    !(from_set && lost)
                })
                .max_by_key(|earlier| earlier.token)
            {
                violations.push(Violation {
                    kind: "fencing",
                    text: format!(
                        "key {key}: call #{} got fencing token {} at {:.3} ms, not above {} used by #{} at {:.3} ms",
                        used.call,
                        used.token,
                        used.at as f64 / 1000.0,
                        earlier.token,
                        earlier.call,
                        earlier.at as f64 / 1000.0
                    ),
                });
            }
        }
    }
}

fn paused_during(facts: &Facts, call: &Call, end: Micros) -> bool {
    facts.pauses.get(&call.client).is_some_and(|pauses| {
        pauses
            .iter()
            .any(|&(from, to)| from < end && to > call.start)
    })
}

/// A call past its wait plus one call deadline (plus a round trip).
fn bounds(rec: &Recorder, facts: &Facts, violations: &mut Vec<Violation>) {
    for call in &rec.calls {
        let (Some(end), Some(outcome)) = (call.end, &call.outcome) else {
            continue;
        };
        if *outcome == Outcome::Cancelled || paused_during(facts, call, end) {
            continue;
        }
        // A run's acquisition ends when its body starts: the same bound.
        // One call deadline for the call in flight when the wait ends, and
        // the round trips of the calls before it (a plain try before the
        // script, each key of a set taken key by key).
        let round_trips = 2 + 2 * call.keys.len() as Micros;
        let bound =
            call.wait.unwrap_or(0) + call.deadline + round_trips * 2 * facts.max_delay + 10_000;
        if end - call.start > bound {
            violations.push(Violation {
                kind: "bound",
                text: format!(
                    "{} took {:.3} ms, more than its wait and one call deadline allow ({:.3} ms); it ended {:?}",
                    call_text(call),
                    (end - call.start) as f64 / 1000.0,
                    bound as f64 / 1000.0,
                    outcome
                ),
            });
        }
    }
}

/// Whether at some instant of `[from, to]` at least `needed` of `nodes`
/// answered.
fn reachable_at_some_point(
    facts: &Facts,
    nodes: &[usize],
    needed: usize,
    from: Micros,
    to: Micros,
) -> bool {
    let mut instants = vec![from];
    for node in nodes {
        for &(_, out_to) in facts.outages.get(node).into_iter().flatten() {
            if out_to >= from && out_to <= to {
                instants.push(out_to);
            }
        }
    }
    instants.into_iter().any(|at| {
        let up = nodes
            .iter()
            .filter(|node| {
                !facts
                    .outages
                    .get(node)
                    .is_some_and(|outages| outages.iter().any(|&(a, b)| a <= at && at < b))
            })
            .count();
        up >= needed
    })
}

/// `Busy` or `WaitTimeout` from a call during which too few of the nodes
/// serving its key answered: nobody could know the lock was busy.
fn wrong_kind(rec: &Recorder, facts: &Facts, violations: &mut Vec<Violation>) {
    for call in &rec.calls {
        let (Some(end), Some(outcome)) = (call.end, &call.outcome) else {
            continue;
        };
        if !outcome.is_busy() || call.nested {
            continue;
        }
        // Another task of the same client holding a key: known in process.
        // A hold let go of without a release that returned Ok (cancelled,
        // dropped) may still be passed on in its process (a hand-off whose
        // outcome is open) until its validity: known there too.
        let in_process_until = |hold: &Hold| {
            let let_go = hold.let_go.max(hold.end);
            match hold.released {
                Some(Outcome::Ok) => let_go,
                _ => rec
                    .calls
                    .get(hold.call)
                    .and_then(|taker| taker.granted_until)
                    .map_or(let_go, |until| until.max(let_go)),
            }
        };
        let local = rec.holds.iter().any(|hold| {
            hold.client == call.client
                && hold.start < end
                && in_process_until(hold) > call.start - 1
                && call.keys.iter().any(|(key, _)| *key == hold.key)
        }) || rec.calls.iter().any(|other| {
            other.client == call.client
                && other.id != call.id
                && other.start < end
                && other.end.is_none_or(|other_end| other_end > call.start)
                && other
                    .keys
                    .iter()
                    .any(|(key, _)| call.keys.iter().any(|(mine, _)| mine == key))
        });
        if local {
            continue;
        }
        // Ended within the hold-back after its client learned of a switch
        // concerning its key: a waiter whose wait ends then finds the lock
        // busy for the holders being told, and sends nothing (design §15;
        // sentinel seed 9129, a 4 ms wait).
        let grace = (call.deadline / 2).min(500_000);
        let held_back = facts.learned.iter().any(|(at, client, names)| {
            *client == call.client
                && *at <= end
                && end <= at + grace
                && call.keys.iter().any(|(key, _)| names.contains(key))
        });
        if held_back {
            continue;
        }
        // A set is busy when any of its keys is, and a key whose servers
        // answered may be held by a lock nobody holds any more (cancelled,
        // kept): only its first key in the set's order, which every round
        // tries first, tells (a silent one makes the call a Redis error).
        let first = call.keys.iter().map(|(key, _)| key).min();
        let unreachable = first.is_some_and(|key| {
            let (nodes, needed) = (facts.serving)(key);
            !reachable_at_some_point(facts, &nodes, needed, call.start, end)
        });
        if unreachable {
            violations.push(Violation {
                kind: "wrong-error",
                text: format!(
                    "{} ended {:?} though too few of its nodes answered for the whole call [{:.3} ms, {:.3} ms]: an error of Redis, not busy",
                    call_text(call),
                    outcome,
                    call.start as f64 / 1000.0,
                    end as f64 / 1000.0
                ),
            });
        }
    }
}

/// After the last fault healed, some acquisition succeeds within the bound.
fn progress(rec: &Recorder, facts: &Facts, violations: &mut Vec<Violation>) {
    if facts.end - facts.healed < facts.progress_bound {
        return;
    }
    let until = facts.healed + facts.progress_bound;
    let progressed = rec.calls.iter().any(|call| {
        matches!(call.op, "acquire" | "try" | "run")
            && call.outcome == Some(Outcome::Ok)
            && call
                .end
                .is_some_and(|end| end >= facts.healed && end <= until)
    });
    if !progressed {
        violations.push(Violation {
            kind: "progress",
            text: format!(
                "no acquisition succeeded from {:.3} ms, when the last fault was over, to {:.3} ms",
                facts.healed as f64 / 1000.0,
                until as f64 / 1000.0
            ),
        });
    }
}

/// Sections of one key a waiting set may see run ahead of it while it
/// waits: design §16 bounds them by the waiters queued ahead and the
/// cohorts' passes; the real-process tests allow 40.
const SET_STARVATION_BOUND: usize = 40;

/// A set that waited while single-key waiters that came after it took one
/// of its keys again and again.
fn starvation(rec: &Recorder, facts: &Facts, violations: &mut Vec<Violation>) {
    for call in rec
        .calls
        .iter()
        .filter(|call| call.set && call.wait.is_some() && !call.nested)
    {
        let (Some(end), Some(outcome)) = (call.end, &call.outcome) else {
            continue;
        };
        if !matches!(outcome, Outcome::Ok | Outcome::WaitTimeout) {
            continue;
        }
        let joined = call.start + 4 * facts.max_delay + 5_000;
        for (key, _) in &call.keys {
            let ahead = rec
                .holds
                .iter()
                .filter(|hold| {
                    hold.key == *key
                        && hold.start > joined
                        && hold.start < end
                        && rec.calls.get(hold.call).is_some_and(|taker| {
                            !taker.set && taker.wait.is_some() && taker.start > joined
                        })
                })
                .count();
            if ahead > SET_STARVATION_BOUND {
                violations.push(Violation {
                    kind: "starvation",
                    text: format!(
                        "set call #{} (c{}.t{} {}) waited [{:.3} ms, {:.3} ms] and ended {:?} while {ahead} sections of {key} by waiters that came after it ran ahead of it (bound {SET_STARVATION_BOUND})",
                        call.id,
                        call.client,
                        call.task,
                        crate::history::keys_text(&call.keys),
                        call.start as f64 / 1000.0,
                        end as f64 / 1000.0,
                        outcome
                    ),
                });
            }
        }
    }
}

/// A lock granted less than the hold-back after its client learned of a
/// switch of primary that concerns it (design §15, "Acquisitions, held
/// back"): for `GRACE` (at most half a call deadline) after learning of a
/// switch, a client sends no acquisition of a key it concerns, and one in
/// flight when it learns (a `MOVED`, the map fetched, the call sent again
/// to the promoted replica) returns its lock only once the hold-back is
/// over, so that the holders of the locks the new primary lacks are told
/// first. A lock granted at the instant its client learned was taken
/// before (its reply and the news came together). Not judged: a lock
/// passed on in the process (`HeldLock::passed_in_process`: the key stayed
/// the client's; a pass the new primary lacked is made good there after
/// the switch, and confirmed then) or re-entered (no call).
fn held_back(rec: &Recorder, facts: &Facts, violations: &mut Vec<Violation>) {
    for call in &rec.calls {
        let (Some(granted), Some(Outcome::Ok)) = (call.end, &call.outcome) else {
            continue;
        };
        if call.reentrant || call.passed || !matches!(call.op, "acquire" | "try" | "run") {
            continue;
        }
        let grace = (call.deadline / 2).min(500_000);
        for (key, _) in &call.keys {
            let learned = facts.learned.iter().find(|(at, client, names)| {
                *client == call.client
                    && *at < granted
                    && granted < at + grace
                    && names.contains(key)
            });
            let Some((at, _, _)) = learned else {
                continue;
            };
            violations.push(Violation {
                kind: "hold-back",
                text: format!(
                    "{} was granted {key} at {:.3} ms, {:.3} ms after its client learned of a switch of primary concerning it ({:.3} ms), within the hold-back ({:.3} ms)",
                    call_text(call),
                    granted as f64 / 1000.0,
                    (granted - at) as f64 / 1000.0,
                    *at as f64 / 1000.0,
                    grace as f64 / 1000.0
                ),
            });
        }
    }
}

/// A call that got no answer within its deadline though, from before half
/// of it, Sentinel had named a primary that answered until the call ended:
/// a call unanswered at half its deadline is sent again where calls go now
/// (design §15: the client hears `+switch-master`, and the call waiting on
/// a stalled old primary moves to the promoted replica; an acquisition
/// after the hold-back that follows a switch). Not judged for a
/// client with a connection that stopped answering before (a lost reply:
/// the next call on it waits out its deadline wherever it goes), or
/// paused.
fn stuck_after_switch(rec: &Recorder, facts: &Facts, violations: &mut Vec<Violation>) {
    if facts.announced.is_empty() {
        return;
    }
    let up = |node: usize, from: Micros, to: Micros| {
        !facts
            .outages
            .get(&node)
            .is_some_and(|outages| outages.iter().any(|&(a, b)| a < to && b > from))
    };
    for call in &rec.calls {
        let (Some(end), Some(Outcome::Redis(message))) = (call.end, &call.outcome) else {
            continue;
        };
        let silenced = facts
            .silenced
            .iter()
            .any(|&(at, client)| client == call.client && at <= end);
        if !message.contains("no answer within") || silenced || paused_during(facts, call, end) {
            continue;
        }
        let half = call.start + call.deadline / 2;
        // The primary named last before the call ended, and when it was
        // first named since the one before.
        let Some(&(_, named)) = facts.announced.iter().rev().find(|(at, _)| *at <= end) else {
            continue;
        };
        let Some(&(since, _)) = facts
            .announced
            .iter()
            .filter(|(at, _)| *at <= end)
            .rev()
            .take_while(|(_, node)| *node == named)
            .last()
        else {
            continue;
        };
        // An acquisition learning of a switch is held back first, up to
        // half its deadline (design §15, `GRACE`): the holders of locks the
        // new primary lacks are told first.
        let held_back = if matches!(call.op, "acquire" | "try" | "run") {
            (call.deadline / 2).min(500_000)
        } else {
            0
        };
        if since + facts.max_delay + 5_000 + held_back > half || !up(named, since, end) {
            continue;
        }
        violations.push(Violation {
            kind: "stuck",
            text: format!(
                "{} [{:.3} ms, {:.3} ms] got no answer within its deadline though Sentinel named node {named} from {:.3} ms, before half of it, and that node answered until the call ended",
                call_text(call),
                call.start as f64 / 1000.0,
                end as f64 / 1000.0,
                since as f64 / 1000.0
            ),
        });
    }
}

/// The longest section of a set's keys by others, and the shortest wait,
/// under which a set must not wait in vain: design §16 lets single-key
/// lockers pass it only with sections longer than their timed retries
/// (500 ms).
const SHORT_SECTION: Micros = 100_000;
const LONG_WAIT: Micros = 1_000_000;

/// A set that waited out a long wait in vain while every section of its
/// keys by others was short (issue 36's hole 3: over a quorum, a set with a
/// fresh ticket each round stood at the back of every line). Only after
/// the last fault, with no call of its keys cancelled or failed around it
/// (a lock taken by a call that did not return it stays until its ttl).
fn starved_sets(rec: &Recorder, facts: &Facts, violations: &mut Vec<Violation>) {
    let max_ttl = rec
        .calls
        .iter()
        .filter_map(|call| option_ms(call, "ttl="))
        .max()
        .unwrap_or(0);
    for call in rec.calls.iter().filter(|call| {
        call.set
            && !call.nested
            && call.start >= facts.healed
            && call.wait.is_some_and(|wait| wait >= LONG_WAIT)
            && call.outcome == Some(Outcome::WaitTimeout)
    }) {
        let Some(end) = call.end else {
            continue;
        };
        if paused_during(facts, call, end) {
            continue;
        }
        let mine = |key: &str| call.keys.iter().any(|(name, _)| name == key);
        let troubled = rec.calls.iter().any(|other| {
            other.keys.iter().any(|(key, _)| mine(key))
                && other.start < end
                && other
                    .end
                    .is_none_or(|other_end| other_end + max_ttl > call.start)
                && !matches!(
                    other.outcome,
                    Some(Outcome::Ok | Outcome::Busy | Outcome::WaitTimeout)
                )
        });
        // A hold's key stays until its holder let go of it, and with
        // `hold_at_least` until then.
        let kept = |hold: &Hold| {
            let at_least = rec
                .calls
                .get(hold.call)
                .and_then(|taker| option_ms(taker, "hold_at_least="))
                .map_or(0, |at_least| hold.start + at_least);
            hold.let_go.max(hold.end).max(at_least)
        };
        let longest = rec
            .holds
            .iter()
            .filter(|hold| mine(&hold.key) && hold.start < end && kept(hold) > call.start)
            .map(|hold| kept(hold) - hold.start)
            .max()
            .unwrap_or(0);
        if troubled || longest > SHORT_SECTION {
            continue;
        }
        violations.push(Violation {
            kind: "starvation",
            text: format!(
                "set call #{} (c{}.t{} {}) waited [{:.3} ms, {:.3} ms] in vain while every section of its keys was {:.3} ms or shorter",
                call.id,
                call.client,
                call.task,
                crate::history::keys_text(&call.keys),
                call.start as f64 / 1000.0,
                end as f64 / 1000.0,
                longest as f64 / 1000.0
            ),
        });
    }
}

/// A duration among a call's options (`ttl=`, `hold_at_least=`), µs.
fn option_ms(call: &Call, name: &str) -> Option<Micros> {
    call.options
        .split(' ')
        .find_map(|option| option.strip_prefix(name))
        .and_then(|ms| ms.strip_suffix("ms"))
        .and_then(|ms| ms.parse::<Micros>().ok())
        .map(|ms| ms * 1000)
}

/// A `fair` acquisition (one key or a set) that took a key ahead of a
/// single-key waiter of another client queued for it before it came
/// (design §4: a fair attempt goes only when the first live waiter in line
/// that is not a set's is the caller; §16: a set's place keeps no key).
///
/// Checked only where the order is the library's to keep: both calls
/// after the last fault (a place outlives no pause or lost server, and a
/// lost reply's re-send may join at the back), neither client with another
/// call or a hold of the key meanwhile (a cohort: tasks of one client share
/// one place and pass the lock among themselves, §4), the waiter queued for
/// certain (its first tries, a subscription on a new connection: eight
/// one-way delays) before the taker started, and the taker's grant
/// certainly before the waiter's (a one-way delay before its end).
fn fair_order(rec: &Recorder, facts: &Facts, violations: &mut Vec<Violation>) {
    let fair = |call: &Call| call.options.split(' ').any(|option| option == "fair");
    let acquisition = |call: &Call| matches!(call.op, "acquire" | "run") && !call.nested;
    let joined_after = 8 * facts.max_delay + 5_000;
    let mut waiters: BTreeMap<&str, Vec<&Call>> = BTreeMap::new();
    for call in &rec.calls {
        if acquisition(call)
            && !call.set
            && call.wait.is_some()
            && call.start >= facts.healed
            && call.keys.len() == 1
            && call.keys[0].1 == Mode::Exclusive
        {
            waiters.entry(&call.keys[0].0).or_default().push(call);
        }
    }
    // Another call of the key, or a hold of it: a hold outlives the call
    // that took it (cluster seed 10070: a waiter queued in its process
    // behind its own client's holder, whose lock expired meanwhile, was
    // taken for one in Redis's line; §4's cohort waiter goes to Redis only
    // once its holder lets go or is found to have lost the lock).
    let stake = |client: usize, key: &str, except: [usize; 2], from: Micros, to: Micros| {
        rec.calls.iter().any(|other| {
            other.client == client
                && !except.contains(&other.id)
                && other.start < to
                && other.end.is_none_or(|end| end > from)
                && other.keys.iter().any(|(name, _)| name == key)
        }) || rec.holds.iter().any(|hold| {
            hold.client == client
                && !except.contains(&hold.call)
                && hold.key == key
                && hold.start < to
                && hold.let_go.max(hold.end) > from
        })
    };
    for taker in &rec.calls {
        let Some(taken) = taker.end else {
            continue;
        };
        if !acquisition(taker)
            || !fair(taker)
            || taker.reentrant
            || taker.outcome != Some(Outcome::Ok)
            || taker.start < facts.healed
            || paused_during(facts, taker, taken)
        {
            continue;
        }
        for (key, mode) in &taker.keys {
            if *mode != Mode::Exclusive {
                continue;
            }
            let passed = waiters
                .get(key.as_str())
                .into_iter()
                .flatten()
                .find(|waiter| {
                    waiter.client != taker.client
                        && waiter.start + joined_after < taker.start
                        && waiter
                            .end
                            .is_some_and(|end| taken + facts.max_delay + 10_000 < end)
                        && !paused_during(facts, waiter, taken)
                        && !stake(
                            waiter.client,
                            key,
                            [waiter.id, taker.id],
                            waiter.start,
                            taken,
                        )
                        && !stake(
                            taker.client,
                            key,
                            [waiter.id, taker.id],
                            waiter.start,
                            taken,
                        )
                });
            if let Some(waiter) = passed {
                violations.push(Violation {
                    kind: "fair-order",
                    text: format!(
                        "fair call #{} (c{}.t{} {} {}, from {:.3} ms) took {key} at {:.3} ms ahead of #{} (c{}.t{} {}), waiting for it since {:.3} ms (until {:.3} ms, {:?})",
                        taker.id,
                        taker.client,
                        taker.task,
                        taker.op,
                        crate::history::keys_text(&taker.keys),
                        taker.start as f64 / 1000.0,
                        taken as f64 / 1000.0,
                        waiter.id,
                        waiter.client,
                        waiter.task,
                        waiter.options,
                        waiter.start as f64 / 1000.0,
                        waiter.end.unwrap_or(0) as f64 / 1000.0,
                        waiter.outcome
                    ),
                });
                break;
            }
        }
    }
}

/// An acquisition that returned a lock whose validity, by the library's
/// own account, was already over: its holder would start its body with no
/// time left (a request that sat in a stalled server longer than its ttl).
/// The library never hands such a lock out (`lease/hold.rs`, `late_reply`).
/// A reentrant entry shares its outer hold and is exempt, as is a client
/// paused meanwhile (its timers jumped past the validity as the call
/// returned).
fn expired_grants(rec: &Recorder, facts: &Facts, violations: &mut Vec<Violation>) {
    for call in &rec.calls {
        let (Some(end), Some(until)) = (call.end, call.granted_until) else {
            continue;
        };
        if call.reentrant || until > end || paused_during(facts, call, end) {
            continue;
        }
        violations.push(Violation {
            kind: "expired-grant",
            text: format!(
                "{} returned a lock at {:.3} ms whose validity had ended at {:.3} ms",
                call_text(call),
                end as f64 / 1000.0,
                until as f64 / 1000.0
            ),
        });
    }
}
