//! A set taken key by key (`Lock::all` with names across cluster slots,
//! over a quorum, in acknowledged mode; docs/design.md §16): never waiting
//! while holding any key of it, and never starved by single-key lockers.
//!
//! - **First round:** a try of each key in the set's order, what an
//!   uncontended set costs (one attempt per key).
//! - **Then, in line:** the set stands in the line of every key at once,
//!   one place per key (`<channel>|<id>:<i>*`, a set's place, which keeps
//!   no key from anyone) that it keeps for its whole wait (over a quorum
//!   with one ticket, so single-key lockers that come later stand behind it
//!   on every key). Each round tries every key at once; a round that does
//!   not get them all gives back what it took without waking the set's own
//!   place (the key stays free for it until a waiter's timed attempt or a
//!   newcomer takes it), then sleeps until a release that makes it first in
//!   a line wakes it, or a timer.

use std::time::Duration;

use tokio::time::Instant;

use futures_util::future::{join_all, select_all};

use crate::backend::{retryable, wait_for, Kind, Respect, Subscription, WaitPlace};
use crate::error::LockError;
use crate::lease::acquire::{
    Acquisition, InLine, FALLBACK_PAUSE, FIRST_ERROR_PAUSE, QUEUE_REFRESH,
};
use crate::lease::guard::LockGuard;
use crate::lease::hold::{drift_margin, Hold};
use crate::lease::multi::{raise_fences, SetAcquisition};
use crate::lease::release::spawn_release;
use crate::lease::set_switch::{confirm_after_switch, switches_seen};
use std::sync::Arc;

/// What a round of tries of every key found.
enum Tried {
    All(Vec<LockGuard>),
    /// The key at `index` was busy, or its servers did not answer
    /// (`unanswered`); what was taken is given back.
    Busy {
        index: usize,
        unanswered: Option<LockError>,
    },
}

impl SetAcquisition<'_> {
    /// Every lock of the set, key by key (see the module's comment).
    pub(super) async fn one_by_one(
        &self,
        members: &[&Acquisition<'_>],
    ) -> Result<Vec<LockGuard>, LockError> {
        // Every key's try ends within one call deadline of the set's start
        // (of its wait's end, for a waiting set's later rounds, below):
        // lock-sim cluster seed 6013, a try of [a, b, c] 610 ms against
        // 604.6, key b tried after a had taken most of the deadline.
        let until = self.started + members[0].core.call_deadline();
        // A give-back after a busy key is not awaited past the wait either:
        // the set then ends, the give-back goes on in the background
        // (lock-sim sentinel seed 13247: a set with a 21 ms wait returned
        // after 4 s, its give-back on a connection that had stopped
        // answering).
        let give_back_by = self.deadline().map_or(until, |end| end.min(until));
        let seen = switches_seen(members[0]);
        let tried = try_each(members, self.wait.is_some(), until, give_back_by).await?;
        let (index, unanswered) = match tried {
            Tried::All(guards) => match finish(members, guards, self.started, seen).await? {
                Finished::Set(guards) => return Ok(guards),
                Finished::Expired(index, error) => {
                    if self.wait.is_none() {
                        return Err(error);
                    }
                    (index, Some(error))
                }
            },
            Tried::Busy { index, unanswered } => (index, unanswered),
        };
        let name = members[index].name;
        if self.wait.is_none() {
            return Err(LockError::Busy {
                name: name.to_owned(),
            });
        }
        if self
            .deadline()
            .is_some_and(|deadline| Instant::now() >= deadline)
        {
            return Err(unanswered.unwrap_or_else(|| self.wait_timeout(name)));
        }
        self.in_line(members, index).await
    }

    /// Rounds of attempts on every key at once, standing in every key's
    /// line between them, until the set is taken or the wait is over.
    async fn in_line(
        &self,
        members: &[&Acquisition<'_>],
        busy: usize,
    ) -> Result<Vec<LockGuard>, LockError> {
        let first = members[0];
        let core = &first.core;
        let notifier = core.notifier();
        let id = core.new_token()?;
        let mut lines: Vec<Line> = members
            .iter()
            .enumerate()
            .map(|(index, member)| {
                let (channel, slot) = notifier.channel_for(&member.keys.lock);
                let waiter = format!("{id}:{index}*");
                Line {
                    place: Kind::Exclusive.queue_entry(&channel, &waiter),
                    subscription: notifier.join_ready(&waiter, slot),
                    waiter,
                    slot,
                    ticket: WaitPlace::default(),
                }
            })
            .collect();
        // Out of every line when the acquisition ends, whatever the outcome.
        let _leave = Leave {
            members,
            places: lines.iter().map(|line| line.place.clone()).collect(),
        };
        let deadline = self.deadline();
        // Right after this client handed one of the keys over, every
        // waiter goes first until the set's first wait (§4).
        let handed_over = members
            .iter()
            .any(|member| core.just_handed_over(&member.keys.lock));
        let mut respect = if handed_over {
            Respect::Everyone
        } else {
            first.fair()
        };
        let mut error_pause = FIRST_ERROR_PAUSE;
        // The key found busy last: tried first, and while it stays busy the
        // others are not taken for nothing, but for the refresh of the
        // set's places in their lines.
        let mut start = busy;
        let mut refreshed: Option<Instant> = None;
        // What the last round found unanswered: the error to return if the
        // wait ends before the next round.
        let mut last_unanswered: Option<LockError> = None;
        loop {
            // No round is sent once the wait is over (a waiting call ends
            // within its wait and one call deadline, §3).
            if deadline.is_some_and(|deadline| Instant::now() >= deadline) {
                let name = members[start].name;
                return Err(last_unanswered.unwrap_or_else(|| self.wait_timeout(name)));
            }
            let notified = any_notified(&lines);
            share_ticket(&lines);
            let refresh = refreshed.is_none_or(|at| at.elapsed() >= PLACE_REFRESH);
            let seen = switches_seen(first);
            let mut round = Round::of(members, &lines, respect, start, refresh, deadline).await?;
            if round.every_key {
                refreshed = Some(Instant::now());
            }
            if round.taken.len() == members.len() {
                // In the members' order (the round took them from the key
                // found busy last): the set's guards are listed that way.
                round.taken.sort_by_key(|taken| taken.index);
                let guards = round
                    .taken
                    .drain(..)
                    .map(|mut taken| members[taken.index].guard_of(taken.keep()))
                    .collect();
                match finish(members, guards, self.started, seen).await? {
                    Finished::Set(guards) => return Ok(guards),
                    // Released in the background; tried again, as after
                    // a round whose servers did not answer, while the wait
                    // lasts.
                    Finished::Expired(index, error) => {
                        round.busy = index;
                        round.unanswered = Some(error);
                    }
                }
            }
            let index = round.busy;
            start = index;
            let now = Instant::now();
            if deadline.is_some_and(|deadline| now >= deadline) {
                // What the round took is released in the background (its
                // drop), not waited for past the wait.
                let name = members[index].name;
                return Err(round
                    .unanswered
                    .take()
                    .unwrap_or_else(|| self.wait_timeout(name)));
            }
            // Not awaited past the wait (a key's server stalled with the
            // give-back on it: lock-sim cluster seed 7068, 1.10 s against
            // 0.95 s when it had no bound; sentinel seed 13247, a set with
            // a 21 ms wait that returned after 4 s when it had until the
            // end of the wait and one call deadline, its give-back on a
            // connection that had stopped answering): past the wait the
            // set ends, and what is left goes on in the background (each
            // `Taken`'s drop).
            match deadline {
                Some(deadline) => {
                    let _ = tokio::time::timeout_at(deadline, round.give_back(&lines)).await;
                }
                None => round.give_back(&lines).await,
            }
            last_unanswered = round.unanswered.take();
            // What is left of the wait once the give-back is done (it may
            // have taken up to a call deadline): no sleep below outlasts it.
            let left = deadline.map_or(Duration::MAX, |deadline| {
                deadline.saturating_duration_since(Instant::now())
            });
            if last_unanswered.is_some() {
                // As a single waiter does: not a reason to give up while
                // the wait lasts.
                tokio::time::sleep(error_pause.min(left)).await;
                error_pause = (error_pause * 2).min(QUEUE_REFRESH);
                continue;
            }
            error_pause = FIRST_ERROR_PAUSE;
            if lines.iter().any(|line| line.subscription.is_none()) {
                // Listen, then try again at once: a release in between is
                // not missed. Every line at once, within what is left of
                // the wait: one after the other, each given all of it, a
                // set of three keys whose channels could not be subscribed
                // (a primary down, another failing over) waited three times
                // that (lock-sim cluster seed 9159: 2,211 ms against 2,006).
                let patience = left.min(QUEUE_REFRESH);
                let notifier = &notifier;
                let subscribing = lines
                    .iter_mut()
                    .filter(|line| line.subscription.is_none())
                    .map(|line| async move {
                        let subscription = notifier.subscribe(&line.waiter, line.slot, patience);
                        line.subscription = Some(subscription.await);
                    });
                join_all(subscribing).await;
                continue;
            }
            respect = first.fair();
            let pause = round.pause.min(QUEUE_REFRESH).min(left);
            wait_for(notified, pause).await;
        }
    }
}

/// A key of the set, all taken now, whose validity is already over: taken
/// key by key, the set took longer than that key's ttl (round trips to a
/// slow server, a ttl shorter than them). The set is not handed out, as a
/// lone lock whose reply came after its validity is not
/// (`hold::late_reply`): its index among `members` and the error.
fn expired_key(
    members: &[&Acquisition<'_>],
    guards: &[LockGuard],
    started: Instant,
) -> Option<(usize, LockError)> {
    let now = Instant::now();
    let hold = guards
        .iter()
        .map(LockGuard::hold)
        // A ttl within its drift margin (1-2 ms) never has validity: not
        // refused for it (`hold::late_reply`).
        .find(|hold| hold.valid_until() <= now && drift_margin(hold.ttl) < hold.ttl)?;
    let index = members
        .iter()
        .position(|member| member.keys.lock == hold.keys.lock)
        .unwrap_or(0);
    let source = std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        format!(
            "the set's keys took {:?} to take, and the validity of `{}` (ttl {:?}) was over \
             by then: not acquired, and the keys are released (a longer ttl leaves room for \
             the round trips)",
            now - started,
            hold.name(),
            hold.ttl
        ),
    );
    Some((
        index,
        LockError::redis(members[index].name, "acquire", source.into()),
    ))
}

/// The set's place in one key's line.
struct Line {
    /// Its entry in the line: `<channel>|<waiter>`.
    place: String,
    /// What a release that makes it first publishes: `<id>:<i>*`.
    waiter: String,
    slot: u16,
    subscription: Option<Subscription>,
    /// Over a quorum, its ticket: the same on every key ([`share_ticket`]).
    ticket: WaitPlace,
}

/// How often a round tries every key even while the key found busy last
/// stays busy: the set's place in a line lapses after the waiter timeout
/// (2 s) without an attempt.
const PLACE_REFRESH: Duration = Duration::from_secs(1);

/// One round: an attempt on each key in turn, from the key found busy last.
struct Round {
    taken: Vec<Taken>,
    /// The first key found not taken (`usize::MAX`: none yet).
    busy: usize,
    /// Every key was tried (the set's places in every line refreshed).
    every_key: bool,
    /// A key whose servers did not answer.
    unanswered: Option<LockError>,
    /// How long to sleep without news: the shortest of the busy keys'.
    pause: Duration,
}

impl Round {
    /// Tries the keys from `start` on, stopping at the first one not taken
    /// unless `refresh` asks for every key, and at the wait's `deadline`:
    /// no attempt after it (each attempt may take a call deadline).
    async fn of(
        members: &[&Acquisition<'_>],
        lines: &[Line],
        respect: Respect,
        start: usize,
        refresh: bool,
        deadline: Option<Instant>,
    ) -> Result<Round, LockError> {
        let mut round = Round {
            taken: Vec::new(),
            busy: usize::MAX,
            every_key: true,
            unanswered: None,
            pause: QUEUE_REFRESH,
        };
        let mut failed = None;
        let order =
            std::iter::once(start).chain((0..members.len()).filter(|&index| index != start));
        for index in order {
            if (round.busy != usize::MAX || failed.is_some()) && !refresh {
                round.every_key = false;
                break;
            }
            if index != start && deadline.is_some_and(|deadline| Instant::now() >= deadline) {
                round.every_key = false;
                round.busy_at(index);
                break;
            }
            let (member, line) = (members[index], &lines[index]);
            let attempt = match member.core.new_token() {
                Ok(token) => {
                    member
                        .attempt_in_line(
                            &token,
                            &line.place,
                            respect,
                            &line.ticket,
                            deadline.map(|deadline| deadline + member.core.call_deadline()),
                        )
                        .await
                }
                Err(error) => Err(error),
            };
            match attempt {
                Ok(InLine::Taken(hold)) => round.taken.push(Taken {
                    index,
                    hold: Some(hold),
                }),
                Ok(InLine::Busy(expires_in)) => {
                    round.busy_at(index);
                    let pause = expires_in.map_or(FALLBACK_PAUSE, |expires_in| {
                        expires_in.saturating_add(Duration::from_millis(1))
                    });
                    round.pause = round.pause.min(pause);
                }
                Err(error @ LockError::Redis { .. }) if matches!(&error, LockError::Redis { source, .. } if retryable(source)) =>
                {
                    round.busy_at(index);
                    round.unanswered = Some(error);
                }
                Err(error) => failed = failed.or(Some(error)),
            }
        }
        match failed {
            // What was taken is released by its drop, in the background.
            Some(error) => Err(error),
            None => Ok(round),
        }
    }

    /// The first key found busy (or unanswered) in this round's order.
    fn busy_at(&mut self, index: usize) {
        if self.busy == usize::MAX {
            self.busy = index;
        }
    }

    /// Gives back what the round took (a give-back that fails is retried
    /// in the background by the hold's drop).
    async fn give_back(&mut self, lines: &[Line]) {
        join_all(self.taken.drain(..).map(|mut taken| async move {
            let own = &lines[taken.index].place;
            let Some(hold) = &taken.hold else { return };
            let backend = hold.core.backend();
            if backend
                .give_back(&hold.keys, &hold.token, own)
                .await
                .is_ok()
            {
                taken.hold.take();
            }
        }))
        .await;
    }
}

/// A key a round took: released in the background if dropped before it
/// became a guard or was given back.
struct Taken {
    index: usize,
    hold: Option<Arc<Hold>>,
}

impl Taken {
    fn keep(&mut self) -> Arc<Hold> {
        self.hold.take().expect("a taken key has its hold")
    }
}

impl Drop for Taken {
    fn drop(&mut self) {
        if let Some(hold) = self.hold.take() {
            hold.never_handed_out();
            spawn_release(hold, false);
        }
    }
}

/// The set's places in its keys' lines, left when the acquisition ends
/// (in the background; a place not given up expires after the waiter
/// timeout).
struct Leave<'a, 'b> {
    members: &'a [&'a Acquisition<'b>],
    places: Vec<String>,
}

impl Drop for Leave<'_, '_> {
    fn drop(&mut self) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let core = Arc::clone(&self.members[0].core);
        let keys: Vec<_> = self
            .members
            .iter()
            .map(|member| member.keys.clone())
            .collect();
        let places = std::mem::take(&mut self.places);
        runtime.spawn(async move {
            let leaving = keys
                .iter()
                .zip(&places)
                .map(|(keys, place)| core.backend().leave(Kind::Exclusive, keys, place));
            let _ = join_all(leaving).await;
        });
    }
}

/// A wake-up for a release of any key that makes the set first in line.
fn any_notified(
    lines: &[Line],
) -> Option<std::pin::Pin<Box<impl std::future::Future<Output = ()>>>> {
    let notified: Vec<_> = lines
        .iter()
        .filter_map(|line| line.subscription.as_ref().map(Subscription::notified))
        .collect();
    (!notified.is_empty()).then(|| {
        Box::pin(async move {
            select_all(notified).await;
        })
    })
}

/// Over a quorum, the set stands in every key's line with one ticket: the
/// earliest any of its places got (one line's own would put it behind
/// single-key lockers that came after the set on another key).
fn share_ticket(lines: &[Line]) {
    use std::sync::atomic::Ordering;
    let tickets = lines
        .iter()
        .map(|line| line.ticket.ticket.load(Ordering::Relaxed));
    let Some(earliest) = tickets.filter(|&ticket| ticket != 0).min() else {
        return;
    };
    for line in lines {
        line.ticket.ticket.store(earliest, Ordering::Relaxed);
    }
}

/// A try of each key in the set's order, giving back what it took at the
/// first busy key.
async fn try_each(
    members: &[&Acquisition<'_>],
    waits: bool,
    until: Instant,
    give_back_by: Instant,
) -> Result<Tried, LockError> {
    let mut taken = Vec::with_capacity(members.len());
    for (index, member) in members.iter().enumerate() {
        let unanswered = match member.once_until(Some(until)).await {
            Ok(guard) => {
                taken.push(guard);
                continue;
            }
            Err(LockError::Busy { .. }) => None,
            Err(error @ LockError::Redis { .. })
                if waits
                    && matches!(&error, LockError::Redis { source, .. } if retryable(source)) =>
            {
                Some(error)
            }
            Err(error) => {
                not_handed_out(&taken);
                if matches!(&error, LockError::Redis { source, .. } if retryable(source)) {
                    drop(taken); // as below: in the background
                } else {
                    // Within the round's deadline too, the rest in the
                    // background (lock-sim cluster seed 73: a set refused
                    // `NotReplicated` on its third key gave back the first
                    // two through a failover, 461 ms against 405).
                    let _ = tokio::time::timeout_at(until, give_back(taken)).await;
                }
                return Err(error);
            }
        };
        not_handed_out(&taken);
        if unanswered.is_some() || !waits {
            // Its servers did not answer within a call deadline, or the
            // call is a try that ends here: what was taken is released in
            // the background (each guard's drop; its own tokens, which no
            // later attempt uses), not waited for, so that the call ends
            // within one deadline (§3): a give-back awaits every server of
            // the key, a stalled one too (lock-sim quorum3 seed 2184).
            drop(taken);
        } else {
            // Within the round's deadline and the wait; the rest in the
            // background.
            let _ = tokio::time::timeout_at(give_back_by, give_back(taken)).await;
        }
        return Ok(Tried::Busy { index, unanswered });
    }
    Ok(Tried::All(taken))
}

/// Releases what a round of tries took (a cancelled give-back goes on in
/// the background: each guard's drop).
async fn give_back(taken: Vec<LockGuard>) {
    not_handed_out(&taken);
    join_all(taken.into_iter().map(LockGuard::release)).await;
}

/// A set whose every key was taken, as [`finish`] leaves it.
enum Finished {
    Set(Vec<LockGuard>),
    /// The key at this index was valid no longer ([`expired_key`]), or
    /// was not found on its new primary after a switch (`set_switch.rs`):
    /// the keys are released in the background.
    Expired(usize, LockError),
}

/// The set, taken: with `fencing`, one token for all of it; not handed out
/// if a key's validity is over by then, or if a key a switch of primary
/// learned of since `seen` (the round's start) concerns is not found where
/// calls go now (`set_switch.rs`).
async fn finish(
    members: &[&Acquisition<'_>],
    guards: Vec<LockGuard>,
    started: Instant,
    seen: Option<u64>,
) -> Result<Finished, LockError> {
    let first = members[0];
    // Part of the acquisition: within one call deadline of its wait's end
    // (of its start, for a try), as its attempts are (lock-sim sentinel
    // seed 6035: a set's try 740 ms against a 680 ms bound, the write-back
    // a whole deadline after the keys).
    // A wait too long to count (no deadline) bounds each round by one call
    // deadline from its end instead: from the set's start, a round that
    // ended later would fail at once (design §3).
    let call_deadline = first.core.call_deadline();
    let until = match (first.settings.wait, first.deadline) {
        (Some(_), None) => Instant::now() + call_deadline,
        (_, deadline) => deadline.unwrap_or(started).max(started) + call_deadline,
    };
    if first.settings.fencing {
        let raised = match tokio::time::timeout_at(until, raise_fences(first, &guards)).await {
            Ok(raised) => raised,
            Err(_elapsed) => Err(LockError::redis(
                first.name,
                "fencing write-back",
                crate::transport::timed_out(call_deadline),
            )),
        };
        if let Err(error) = raised {
            not_handed_out(&guards);
            return Err(error);
        }
    }
    // A key not found where calls go now, or not checked in time: as a
    // round whose keys were not all valid (a waiting set tries again while
    // its wait lasts). Each guard's drop releases its key in the background.
    if let Some((index, error)) = confirm_after_switch(members, &guards, seen, until).await {
        not_handed_out(&guards);
        return Ok(Finished::Expired(index, error));
    }
    Ok(match expired_key(members, &guards, started) {
        None => Finished::Set(guards),
        // Each guard's drop releases its key in the background.
        Some((index, error)) => {
            not_handed_out(&guards);
            Finished::Expired(index, error)
        }
    })
}

/// Keys of the set given back or dropped before the set was handed out:
/// released whole, not kept for `hold_at_least` (no job ran under them).
fn not_handed_out(guards: &[LockGuard]) {
    for guard in guards {
        guard.hold().never_handed_out();
    }
}
