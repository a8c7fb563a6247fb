//! The switches of primary a client learns of (docs/design.md §15
//! "Making good what the old primary was told", §12 "Failover").
//!
//! After a failover the replica promoted lacks what the old primary was
//! told since the promotion (or since the last write it replicated), and
//! the old primary may go on taking writes until it learns it is one no
//! longer. A client learns of the switch later than it happened: from a
//! sentinel's `+switch-master`, from a `READONLY` answer or a failed call
//! (then the sentinels name another primary), or on a Redis Cluster from a
//! slot map, fetched after a `MOVED`, in which the primary that served a
//! slot serves none any more.
//!
//! [`Switches`] numbers the switches a client learned of and says which
//! slots each concerned (all of them with Sentinel). The lease layer tags
//! each release and renewal with the number current when it was sent; a
//! write tagged before a switch that concerns its slot may have gone to the
//! old primary only, and is made good on the new one (`lease/replay.rs`).

use std::collections::{BTreeSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::Instant;

use crate::signal::{Changes, Signal};

/// A Redis Cluster's slot map: slot ranges and the primary (`host:port`)
/// of each (`cluster::slot_map::Ranges`, named here without depending on
/// the cluster's module, which depends on this one).
type Ranges = Vec<(u16, u16, String)>;

/// How long after learning of a switch the client holds its acquisitions
/// of the keys concerned back (at most half a call's deadline): the holders
/// of locks taken on the old primary since the promotion, which the new
/// one lacks, are told in that time (every client renews its holds on the
/// new primary as soon as it learns of the switch: a renewal that finds its
/// key gone reports the lock lost, stopping its body), rather than finding
/// their lock taken by someone else while they still run.
pub(crate) const GRACE: Duration = Duration::from_millis(500);

/// How many switches are remembered (a listener that fell further behind
/// takes the ones it missed as concerning every slot).
const REMEMBERED: usize = 32;

/// The slots of a cluster, one bit each.
pub(crate) struct SlotSet(Box<[u64; 256]>);

impl SlotSet {
    fn new() -> SlotSet {
        SlotSet(Box::new([0; 256]))
    }

    fn insert(&mut self, slot: u16) {
        let slot = usize::from(slot % 16384);
        self.0[slot / 64] |= 1 << (slot % 64);
    }

    pub(crate) fn contains(&self, slot: u16) -> bool {
        let slot = usize::from(slot % 16384);
        self.0[slot / 64] & (1 << (slot % 64)) != 0
    }

    fn union(&self, other: &SlotSet) -> SlotSet {
        let mut both = SlotSet::new();
        for (word, (a, b)) in both.0.iter_mut().zip(self.0.iter().zip(other.0.iter())) {
            *word = a | b;
        }
        both
    }

    fn is_empty(&self) -> bool {
        self.0.iter().all(|word| *word == 0)
    }
}

/// One switch of primary the client learned of.
#[derive(Clone)]
pub(crate) struct Switch {
    /// Its number: the first is 1.
    pub(crate) number: u64,
    /// The slots whose primary changed; `None`: every key (Sentinel's
    /// primary, or a switch too old to be remembered).
    pub(crate) slots: Option<Arc<SlotSet>>,
}

impl Switch {
    /// Whether the key of slot `slot` (on a cluster; `None` elsewhere) is
    /// concerned.
    pub(crate) fn concerns(&self, slot: Option<u16>) -> bool {
        match (&self.slots, slot) {
            (Some(slots), Some(slot)) => slots.contains(slot),
            _ => true,
        }
    }
}

/// The switches of primary a client learned of, shared by every
/// connection that can learn of one (the lock calls', the acknowledged
/// pool's, Sentinel's watcher).
pub(crate) struct Switches {
    /// The number of the last switch (0: none yet): what a write is tagged
    /// with, read with one atomic load.
    count: AtomicU64,
    /// The last switches, in order.
    recent: Mutex<VecDeque<Switch>>,
    /// Each new number, for whoever makes writes good on the new primary.
    changed: Arc<Signal<u64>>,
    /// On a cluster: the primaries of the last slot map seen.
    primaries: Mutex<Option<(Arc<Ranges>, BTreeSet<String>)>>,
    /// How long acquisitions are held back after a switch ([`GRACE`], at
    /// most half a call's deadline).
    grace: Duration,
    /// Until when acquisitions of the keys concerned by the last switches
    /// are held back: nanoseconds after `origin`, 0 when none are (read
    /// with one atomic load by every acquisition).
    hold_back_until: AtomicU64,
    /// The slots held back (`None`: every key).
    hold_back_slots: Mutex<Option<Arc<SlotSet>>>,
    origin: Instant,
}

impl Drop for Switches {
    fn drop(&mut self) {
        // Its listeners (the renewal driver, the replays' watcher) end.
        self.changed.close();
    }
}

impl Switches {
    /// `call_deadline`: the longest one call may take (the hold-back after
    /// a switch is at most half of it).
    pub(crate) fn new(call_deadline: Duration) -> Arc<Switches> {
        Arc::new(Switches {
            count: AtomicU64::new(0),
            recent: Mutex::new(VecDeque::new()),
            changed: Arc::new(Signal::new(0)),
            primaries: Mutex::new(None),
            grace: GRACE.min(call_deadline / 2),
            hold_back_until: AtomicU64::new(0),
            hold_back_slots: Mutex::new(None),
            origin: Instant::now(),
        })
    }

    /// Until when an acquisition of a key of slot `slot` (on a cluster;
    /// `None` elsewhere) is held back, if it is: a switch that concerns it
    /// was learned of less than the grace ago.
    pub(crate) fn held_back(&self, slot: impl FnOnce() -> Option<u16>) -> Option<Instant> {
        let until = self.hold_back_until.load(Ordering::Acquire);
        if until == 0 {
            return None;
        }
        let until = self.origin + Duration::from_nanos(until);
        if Instant::now() >= until {
            // Over: the next acquisitions read a 0 (unless a later switch
            // moved it meanwhile).
            let _ = self.hold_back_until.compare_exchange(
                self.nanos(until),
                0,
                Ordering::AcqRel,
                Ordering::Acquire,
            );
            return None;
        }
        let slots = self
            .hold_back_slots
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone();
        match (slots, slot()) {
            (Some(slots), Some(slot)) if !slots.contains(slot) => None,
            _ => Some(until),
        }
    }

    fn nanos(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.origin).as_nanos())
            .unwrap_or(u64::MAX)
            .max(1)
    }

    fn recent(&self) -> MutexGuard<'_, VecDeque<Switch>> {
        self.recent
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The number of the last switch learned of (0: none).
    pub(crate) fn current(&self) -> u64 {
        self.count.load(Ordering::Acquire)
    }

    /// Each new switch's number.
    pub(crate) fn subscribe(&self) -> Changes {
        Changes::new(&self.changed)
    }

    /// The switches numbered after `seen`, in order (those no longer
    /// remembered as concerning every slot).
    pub(crate) fn since(&self, seen: u64) -> Vec<Switch> {
        let recent = self.recent();
        let current = self.current();
        (seen + 1..=current)
            .map(|number| {
                recent
                    .iter()
                    .find(|switch| switch.number == number)
                    .cloned()
                    .unwrap_or(Switch {
                        number,
                        slots: None,
                    })
            })
            .collect()
    }

    /// A switch of `slots` (`None`: the primary of every key) was learned
    /// of.
    pub(crate) fn switched(&self, slots: Option<SlotSet>) {
        let slots = slots.map(Arc::new);
        {
            // The slots held back: these, with those of a switch still
            // held back.
            let mut held = self
                .hold_back_slots
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            let still = self.hold_back_until.load(Ordering::Acquire) != 0;
            *held = match (&slots, held.as_ref()) {
                (Some(new), Some(old)) if still => Some(Arc::new(new.union(old))),
                (Some(_), None) if still => None,
                (new, _) => new.clone(),
            };
            let until = self.nanos(Instant::now() + self.grace);
            self.hold_back_until.store(until, Ordering::Release);
        }
        let mut recent = self.recent();
        let number = self.count.load(Ordering::Acquire) + 1;
        recent.push_back(Switch { number, slots });
        if recent.len() > REMEMBERED {
            recent.pop_front();
        }
        self.count.store(number, Ordering::Release);
        drop(recent);
        self.changed.send_if_modified(|last| {
            *last = number;
            true
        });
    }

    /// A Redis Cluster's slot map was fetched: the slots whose primary in
    /// the last map seen is a primary no longer (it failed, or was made a
    /// replica of the one promoted) are switched. A slot that migrated
    /// between two primaries is not: `MIGRATE` moved its keys whole.
    pub(crate) fn map_seen(&self, ranges: &Arc<Ranges>) {
        let primaries: BTreeSet<String> = ranges.iter().map(|(_, _, node)| node.clone()).collect();
        let mut last = self
            .primaries
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let previous = last.replace((Arc::clone(ranges), primaries.clone()));
        let Some((previous, _)) = previous else {
            return;
        };
        if Arc::ptr_eq(&previous, ranges) {
            return;
        }
        let mut slots = SlotSet::new();
        for (start, end, node) in previous.iter() {
            if !primaries.contains(node) {
                for slot in *start..=(*end).min(16383) {
                    slots.insert(slot);
                }
            }
        }
        drop(last);
        if !slots.is_empty() {
            tracing::info!(
                "a Redis Cluster primary serves no slot any more (failed over): the releases and \
                 renewals sent to it lately are made good on the primaries now serving its slots"
            );
            self.switched(Some(slots));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ranges(nodes: &[(u16, u16, &str)]) -> Arc<Ranges> {
        Arc::new(
            nodes
                .iter()
                .map(|(start, end, node)| (*start, *end, (*node).to_owned()))
                .collect(),
        )
    }

    #[test]
    fn a_primary_gone_from_the_map_switches_its_slots_and_a_migration_does_not() {
        let switches = Switches::new(Duration::from_secs(2));
        switches.map_seen(&ranges(&[(0, 99, "a:1"), (100, 16383, "b:1")]));
        assert_eq!(switches.current(), 0, "the first map is no switch");
        // Slot 50 migrated from a to b: a still serves slots.
        switches.map_seen(&ranges(&[(0, 49, "a:1"), (50, 16383, "b:1")]));
        assert_eq!(switches.current(), 0);
        // a failed over to c.
        assert_eq!(switches.held_back(|| Some(10)), None);
        switches.map_seen(&ranges(&[(0, 49, "c:1"), (50, 16383, "b:1")]));
        assert_eq!(switches.current(), 1);
        // Acquisitions in the slots that switched are held back for the
        // grace; the others are not.
        let until = switches.held_back(|| Some(10)).expect("held back");
        assert!(until > Instant::now() && until <= Instant::now() + GRACE);
        assert_eq!(switches.held_back(|| Some(60)), None);
        let switch = &switches.since(0)[0];
        assert!(switch.concerns(Some(10)) && !switch.concerns(Some(60)));
        assert!(switch.concerns(None));
        switches.switched(None);
        let all = switches.since(0);
        assert_eq!(all.len(), 2);
        assert!(all[1].concerns(Some(60)));
    }
}
