//! A semaphore over a quorum holds named slots: its capacity N is slots
//! 0..N, and an attempt for k permits asks every node for the same k slots
//! (design §13, "Semaphores over a quorum"). A node grants them only when
//! every one is free there, so a slot is held by one holder at most (two
//! majorities share a node) and at most N permits are held; a count of
//! permits per node would not do (three holders of a semaphore of 2 can
//! each win a different majority of 3 nodes).
//!
//! Which slots to ask for: the first attempt picks k consecutive slots from
//! a random start (an idle semaphore grants any); a refusing node reports
//! the slots others hold there, and the next attempt asks for the slots
//! reported taken by the fewest nodes (free ones first), from a random
//! start, so that waiters spread over the free slots.

use std::sync::PoisonError;

use crate::backend::WaitPlace;
use crate::token::Random;

/// The slots the attempt asks for, comma-separated: the ones its last
/// refusals suggested, or k from a random start.
pub(super) fn ask(
    place: Option<&WaitPlace>,
    capacity: u32,
    permits: u32,
    random: &Random,
) -> String {
    let remembered = place
        .map(|place| {
            place
                .slots
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .0
                .clone()
        })
        .filter(|slots| slots.len() == permits as usize);
    let slots = remembered.unwrap_or_else(|| {
        let start = random_below(random, capacity);
        (0..permits.min(capacity))
            .map(|i| (start + i) % capacity.max(1))
            .collect()
    });
    let text: Vec<String> = slots.iter().map(u32::to_string).collect();
    text.join(",")
}

/// Remembers the slots for the next attempt: those reported taken by the
/// fewest refusing nodes (none, if k are free everywhere), from a random
/// start; and whether each could be free on a majority of the `nodes`
/// (reported taken by at most `nodes - quorum`: an attempt settles once it
/// can no longer hold, before every node answered, so those not heard from
/// count as free; then another attempt right away may well hold).
pub(super) fn learn(
    place: &WaitPlace,
    taken: &[&[u32]],
    nodes: usize,
    quorum: usize,
    capacity: u32,
    permits: u32,
    random: &Random,
) {
    let slots = choose(taken, capacity, permits, random_below(random, capacity));
    let reported = |slot: u32| taken.iter().filter(|node| node.contains(&slot)).count();
    let promising = slots
        .iter()
        .all(|&slot| nodes.saturating_sub(reported(slot)) >= quorum);
    *place.slots.lock().unwrap_or_else(PoisonError::into_inner) = (slots, promising);
}

/// Whether the slots remembered looked free on a majority.
pub(super) fn promising(place: &WaitPlace) -> bool {
    place.slots.lock().unwrap_or_else(PoisonError::into_inner).1
}

/// k slots of 0..capacity, fewest reports first, from `start` on.
pub(super) fn choose(taken: &[&[u32]], capacity: u32, permits: u32, start: u32) -> Vec<u32> {
    let mut reports: std::collections::HashMap<u32, usize> = std::collections::HashMap::new();
    for node in taken {
        for &slot in *node {
            *reports.entry(slot).or_default() += 1;
        }
    }
    let capacity = capacity.max(1);
    let mut chosen: Vec<(usize, u32)> = Vec::with_capacity(permits as usize);
    // Free everywhere first (bounded: at most `reports.len()` slots are
    // passed over), then the least reported.
    for i in 0..capacity {
        if chosen.len() == permits as usize {
            return chosen.into_iter().map(|(_, slot)| slot).collect();
        }
        let slot = (start + i) % capacity;
        if !reports.contains_key(&slot) {
            chosen.push((0, slot));
        }
    }
    let mut rest: Vec<(usize, u32)> = reports.into_iter().map(|(slot, n)| (n, slot)).collect();
    rest.sort_unstable();
    chosen.extend(rest.into_iter().take(permits as usize - chosen.len()));
    chosen.into_iter().map(|(_, slot)| slot).collect()
}

fn random_below(random: &Random, most: u32) -> u32 {
    random.below(u64::from(most)) as u32
}

#[cfg(test)]
mod tests {
    use super::choose;

    #[test]
    fn free_slots_first_then_the_least_reported() {
        assert_eq!(choose(&[], 4, 2, 3), vec![3, 0]);
        assert_eq!(choose(&[&[0, 1], &[1, 2]], 4, 1, 0), vec![3]);
        assert_eq!(choose(&[&[0, 1], &[1, 2], &[0, 3]], 4, 1, 0), vec![2]);
        let both = choose(&[&[0, 1], &[1, 2], &[0, 3]], 4, 2, 0);
        assert_eq!(both.len(), 2);
        assert!(!both.contains(&1));
    }
}
