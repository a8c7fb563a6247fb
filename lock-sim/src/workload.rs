//! What the simulated clients do: several clients with several tasks each,
//! every primitive and option, bodies that hold their locks for a while,
//! callers cancelled at random. Every call and hold is recorded with the
//! validity the library itself gave it (`HeldLock::valid_until`).

use std::future::Future;
use std::sync::{Arc, Mutex};

use std::time::Duration;

use lock_runtime::{Client, HeldLock, Lock, LockError, RwLock, Semaphore};

use crate::deploy::Backend;
use crate::history::{Call, FenceUse, Hold, Mode, Outcome};
use crate::rng::Rng;
use crate::world::{Micros, Shared};

/// The names a run's tasks lock, and how.
#[derive(Clone, Debug)]
pub struct Names {
    /// Exclusive locks (single and in sets).
    pub exclusive: Vec<String>,
    /// A read/write lock.
    pub rw: String,
    /// A semaphore, and its permits.
    pub semaphore: String,
    pub capacity: u32,
}

/// The mix of a run: which primitives and options its tasks use.
#[derive(Clone, Debug)]
pub struct Mix {
    /// Percent of operations of each primitive: exclusive, read/write,
    /// semaphore, sets, nested.
    pub weights: [u64; 5],
    pub fair_pct: u64,
    pub fencing_pct: u64,
    pub renew_pct: u64,
    pub hold_at_least_pct: u64,
    pub wait_pct: u64,
    pub cancel_pct: u64,
    /// ttls from, to (ms).
    pub ttl_ms: (u64, u64),
    /// The longest wait (ms).
    pub wait_ms: u64,
    /// Body steps: how many at most, and the longest (ms).
    pub steps: u64,
    pub step_ms: u64,
    /// The longest idle time between two operations of a task (ms).
    pub idle_ms: u64,
    /// Whether fair locks are allowed (not over a quorum).
    pub fair_ok: bool,
}

/// What a task's operations need.
pub struct Env {
    pub shared: Arc<Shared>,
    pub clients: Vec<Client>,
    /// Each client's call deadline (connect + response timeout), µs.
    pub deadlines: Vec<Micros>,
    pub names: Names,
    pub mix: Mix,
    pub backend: Backend,
}

impl Env {
    fn now(&self) -> Micros {
        self.shared.with(|world| world.now())
    }

    fn micros(&self, instant: tokio::time::Instant) -> Micros {
        self.shared.with(|world| world.micros_of(instant))
    }

    fn begin(&self, call: Call) -> usize {
        self.shared.with(|world| world.rec.begin(call))
    }

    fn end(&self, id: usize, outcome: Outcome, detail: String) {
        self.shared.with(|world| {
            let now = world.now();
            world.rec.end(id, now, outcome, detail)
        })
    }

    /// The acquisition `id` returned a lock valid until `until`.
    /// An acquisition returned a lock valid until `until`; `passed`: handed
    /// to it by another task of its client.
    fn granted(&self, id: usize, until: Micros, passed: bool) {
        self.shared.with(|world| {
            world.rec.calls[id].granted_until = Some(until);
            world.rec.calls[id].passed = passed;
        })
    }

    fn hold(&self, hold: Hold) {
        self.shared.with(|world| world.rec.hold(hold))
    }

    fn fence(&self, fence: FenceUse) {
        self.shared.with(|world| world.rec.fence(fence))
    }
}

/// What a task does: anything (a mixed run), or, in a contention run, sets
/// of the run's exclusive keys, or one key alone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Role {
    Any,
    Sets,
    Single(String),
}

/// One operation of a task.
#[derive(Clone, Debug)]
struct Op {
    what: What,
    ttl: Duration,
    wait: Option<Duration>,
    renew: bool,
    fair: bool,
    fencing: bool,
    hold_at_least: Option<Duration>,
    api: Api,
    steps: Vec<Duration>,
    /// The caller drops the acquisition (or the whole `run`) after this.
    cancel: Option<Duration>,
}

#[derive(Clone, Debug)]
enum What {
    Single(String, Mode),
    Set(Vec<String>),
    /// x, then y inside x's body, then the set [x, y] (fenced) inside
    /// both, all taken further up: design §16's reentrant set.
    Nested(String, String),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Api {
    /// `acquire` (or `try_acquire` without a wait), a body, `release`.
    Guard,
    /// `Lock::run(body)`.
    Run,
    /// The attribute's runtime entry (`__private::run`).
    Attribute,
}

impl Op {
    fn options(&self) -> String {
        let mut options = vec![format!("ttl={}ms", self.ttl.as_millis())];
        if let Some(wait) = self.wait {
            options.push(format!("wait={}ms", wait.as_millis()));
        }
        for (on, name) in [
            (self.renew, "renew"),
            (self.fair, "fair"),
            (self.fencing, "fencing"),
        ] {
            if on {
                options.push(name.to_owned());
            }
        }
        if let Some(at_least) = self.hold_at_least {
            options.push(format!("hold_at_least={}ms", at_least.as_millis()));
        }
        options.push(format!("{:?}", self.api).to_ascii_lowercase());
        if let Some(cancel) = self.cancel {
            options.push(format!("cancel={}us", cancel.as_micros()));
        }
        options.join(" ")
    }
}

fn choose(rng: &mut Rng, env: &Env) -> Op {
    let mix = &env.mix;
    let total: u64 = mix.weights.iter().sum();
    let mut pick = rng.below(total.max(1));
    let mut kind = 0;
    for (at, weight) in mix.weights.iter().enumerate() {
        if pick < *weight {
            kind = at;
            break;
        }
        pick -= weight;
    }
    let names = &env.names;
    let what = match kind {
        0 => What::Single(rng.pick(&names.exclusive).clone(), Mode::Exclusive),
        1 => What::Single(
            names.rw.clone(),
            if rng.chance(50) {
                Mode::Read
            } else {
                Mode::Write
            },
        ),
        2 => {
            let permits = rng.range(1, u64::from(names.capacity)) as u32;
            What::Single(
                names.semaphore.clone(),
                Mode::Permits {
                    permits,
                    capacity: names.capacity,
                },
            )
        }
        3 => {
            let mut set = names.exclusive.clone();
            while set.len() > 2 && rng.chance(60) {
                let at = rng.below(set.len() as u64) as usize;
                set.remove(at);
            }
            What::Set(set)
        }
        _ => {
            let x = rng.below(names.exclusive.len() as u64) as usize;
            let mut y = rng.below(names.exclusive.len() as u64 - 1) as usize;
            if y >= x {
                y += 1;
            }
            What::Nested(names.exclusive[x].clone(), names.exclusive[y].clone())
        }
    };
    let ttl = Duration::from_millis(rng.range(mix.ttl_ms.0, mix.ttl_ms.1));
    let renew = rng.chance(mix.renew_pct);
    let wait = rng
        .chance(mix.wait_pct)
        .then(|| Duration::from_millis(rng.range(1, mix.wait_ms)));
    let semaphore = matches!(what, What::Single(_, Mode::Permits { .. }));
    let read = matches!(what, What::Single(_, Mode::Read));
    let fair = mix.fair_ok && !matches!(what, What::Nested(..)) && rng.chance(mix.fair_pct);
    let fencing = !semaphore && (matches!(what, What::Nested(..)) || rng.chance(mix.fencing_pct));
    let hold_at_least = (!semaphore && !read && rng.chance(mix.hold_at_least_pct))
        .then(|| Duration::from_millis(rng.range(1, mix.ttl_ms.1)));
    let api = match (&what, rng.below(4)) {
        (What::Nested(..), _) => Api::Run,
        (_, 0 | 1) => Api::Guard,
        (What::Set(_), _) => Api::Guard,
        (_, 2) => Api::Run,
        _ => Api::Attribute,
    };
    let steps = (0..rng.range(1, mix.steps))
        .map(|_| Duration::from_micros(rng.range(100, mix.step_ms * 1000)))
        .collect();
    let cancel = rng.chance(mix.cancel_pct).then(|| {
        Duration::from_micros(match rng.below(3) {
            0 => 0,
            1 => rng.range(1, 3_000),
            _ => rng.range(1, mix.wait_ms * 1000 + 50_000),
        })
    });
    Op {
        what,
        ttl,
        wait,
        renew,
        fair,
        fencing,
        hold_at_least,
        api,
        steps,
        cancel,
    }
}

/// An operation of a contention run's task: a set of at least two of the
/// run's keys, or its one key, with a long wait and a short section.
fn contend(rng: &mut Rng, env: &Env, role: &Role) -> Op {
    let mix = &env.mix;
    let what = match role {
        Role::Single(name) => What::Single(name.clone(), Mode::Exclusive),
        _ => {
            let mut set = env.names.exclusive.clone();
            if set.len() > 2 && rng.chance(50) {
                set.remove(rng.below(set.len() as u64) as usize);
            }
            What::Set(set)
        }
    };
    let set = matches!(what, What::Set(_));
    let wait = if set {
        rng.range(2_000, mix.wait_ms)
    } else {
        rng.range(1_000, mix.wait_ms)
    };
    // Tries (a switching run's), again at once when busy.
    // (No draw when every attempt waits: a contention run's draws stay as
    // they were.)
    let tries = !set && mix.wait_pct < 100 && !rng.chance(mix.wait_pct);
    let wait = (!tries).then(|| Duration::from_millis(wait));
    Op {
        what,
        ttl: Duration::from_millis(rng.range(mix.ttl_ms.0, mix.ttl_ms.1)),
        wait,
        renew: rng.chance(mix.renew_pct),
        fair: mix.fair_ok && rng.chance(mix.fair_pct),
        fencing: rng.chance(mix.fencing_pct),
        hold_at_least: None,
        api: if set || rng.chance(50) {
            Api::Guard
        } else {
            Api::Run
        },
        steps: vec![Duration::from_micros(rng.range(100, mix.step_ms * 1000))],
        cancel: None,
    }
}

/// A task's life: operations until `until`.
pub async fn task(
    env: Arc<Env>,
    client: usize,
    task: usize,
    role: Role,
    mut rng: Rng,
    until: Micros,
) {
    while env.now() < until {
        let op = match role {
            Role::Any => choose(&mut rng, &env),
            _ => contend(&mut rng, &env, &role),
        };
        let ctx = Ctx {
            env: &env,
            client,
            task,
        };
        match &op.what {
            What::Single(name, mode) => ctx.single(&op, name, *mode, false).await,
            What::Set(names) => ctx.set(&op, names).await,
            What::Nested(x, y) => ctx.nested(&op, x, y).await,
        }
        let idle = rng.range(0, env.mix.idle_ms * 1000);
        tokio::time::sleep(Duration::from_micros(idle)).await;
    }
}

/// Drops `future` after `cancel`, if given (`None`: dropped).
async fn cancellable<F: Future>(cancel: Option<Duration>, future: F) -> Option<F::Output> {
    match cancel {
        None => Some(future.await),
        Some(after) => tokio::time::timeout(after, future).await.ok(),
    }
}

/// How a hold's validity looked at one instant.
enum Sample {
    /// Held, valid until then.
    Valid(Micros),
    /// Not held since then (its validity's end, or now for a loss found
    /// before it).
    Ended(Micros, &'static str),
}

struct Ctx<'a> {
    env: &'a Env,
    client: usize,
    task: usize,
}

impl Ctx<'_> {
    fn sample(&self, held: &[HeldLock]) -> Sample {
        let now = self.env.now();
        let until = held
            .iter()
            .map(|lock| self.env.micros(lock.valid_until()))
            .min()
            .unwrap_or(now);
        if now >= until {
            return Sample::Ended(until, "validity");
        }
        if held.iter().any(|lock| !lock.is_held()) {
            // Ended when the library recorded the loss (the holder is told
            // from then on), not when this body next looked.
            let at = held
                .iter()
                .filter_map(|lock| lock.lost_at())
                .map(|at| self.env.micros(at))
                .min()
                .map_or(now, |at| at.min(now));
            return Sample::Ended(at, "loss");
        }
        Sample::Valid(until)
    }

    /// A body: its steps, each only while the locks are valid. Returns when
    /// its hold ended (by its own account) and why, or `None` if it is still
    /// valid at the end.
    async fn body(&self, held: &[HeldLock], steps: &[Duration]) -> Option<(Micros, &'static str)> {
        for step in steps {
            match self.sample(held) {
                Sample::Ended(at, why) => return Some((at, why)),
                Sample::Valid(until) => {
                    let now = self.env.now();
                    let sleep = (step.as_micros() as Micros).min(until - now).max(0);
                    tokio::time::sleep(Duration::from_micros(sleep as u64)).await;
                }
            }
        }
        None
    }

    /// What a release may take beyond one call deadline: nothing. A lock
    /// passed in the process waits for its pass's outcome before anything
    /// is sent with its token, and a cohort holder's release returns within
    /// one call deadline, finishing in the background past it
    /// (`lease/guard.rs`, `release_bounded`; design §4).
    fn release_allowance(&self, _held: &[HeldLock]) -> Option<Micros> {
        None
    }

    /// The end of a hold whose holder stops using it now.
    fn ends_now(
        &self,
        held: &[HeldLock],
        ended: Option<(Micros, &'static str)>,
    ) -> (Micros, &'static str) {
        if let Some(ended) = ended {
            return ended;
        }
        match self.sample(held) {
            Sample::Ended(at, why) => (at, why),
            Sample::Valid(_) => (self.env.now(), "release"),
        }
    }

    fn call(&self, op: &Op, name: &'static str, keys: Vec<(String, Mode)>, nested: bool) -> Call {
        Call {
            id: 0,
            client: self.client,
            task: self.task,
            op: name,
            keys,
            options: op.options(),
            start: self.env.now(),
            end: None,
            outcome: None,
            wait: op.wait.map(|wait| wait.as_micros() as Micros),
            deadline: self.env.deadlines[self.client],
            set: false,
            nested,
            reentrant: false,
            granted_until: None,
            passed: false,
        }
    }

    fn lock(&self, op: &Op, name: &str, mode: Mode) -> Lock {
        let client = self.env.clients[self.client].clone();
        let lock = match mode {
            Mode::Exclusive => {
                let mut lock = Lock::new(name);
                if op.fair {
                    lock = lock.fair();
                }
                if op.fencing {
                    lock = lock.fencing();
                }
                if let Some(at_least) = op.hold_at_least {
                    lock = lock.hold_at_least(at_least);
                }
                lock
            }
            Mode::Read | Mode::Write => {
                let mut rw = RwLock::new(name);
                if op.fair {
                    rw = rw.fair();
                }
                if op.fencing {
                    rw = rw.fencing();
                }
                if let (Some(at_least), Mode::Write) = (op.hold_at_least, mode) {
                    rw = rw.hold_at_least(at_least);
                }
                if mode == Mode::Read {
                    rw.read()
                } else {
                    rw.write()
                }
            }
            Mode::Permits { permits, capacity } => {
                let mut semaphore = Semaphore::new(name, capacity);
                if op.fair {
                    semaphore = semaphore.fair();
                }
                semaphore.take(permits)
            }
        };
        let mut lock = lock.ttl(op.ttl).client(client);
        if let Some(wait) = op.wait {
            lock = lock.wait(wait);
        }
        if op.renew {
            lock = lock.renew();
        }
        lock
    }

    /// A single lock, through the operation's API.
    async fn single(&self, op: &Op, name: &str, mode: Mode, nested: bool) {
        let lock = self.lock(op, name, mode);
        match op.api {
            Api::Guard => self.single_guard(op, &lock, name, mode, nested).await,
            Api::Run | Api::Attribute => {
                self.single_run(op, &lock, name, mode, nested, |held| async move {
                    self.body(&[held], &op.steps).await
                })
                .await
            }
        }
    }

    async fn single_guard(&self, op: &Op, lock: &Lock, name: &str, mode: Mode, nested: bool) {
        let env = self.env;
        let try_only = op.wait.is_none();
        let mut call = self.call(
            op,
            if try_only { "try" } else { "acquire" },
            vec![(name.to_owned(), mode)],
            nested,
        );
        call.wait = op.wait.map(|wait| wait.as_micros() as Micros);
        let call_start = call.start;
        let id = env.begin(call);
        let acquired = cancellable(op.cancel, async {
            if try_only {
                lock.try_acquire().await
            } else {
                lock.acquire().await
            }
        })
        .await;
        let guard = match acquired {
            None => return env.end(id, Outcome::Cancelled, String::new()),
            Some(Err(error)) => return env.end(id, Outcome::from_error(&error), String::new()),
            Some(Ok(guard)) => guard,
        };
        let start = env.now();
        let reentrant = guard.is_reentrant();
        env.granted(
            id,
            env.micros(guard.valid_until()),
            guard.passed_in_process(),
        );
        if reentrant {
            env.shared
                .with(|world| world.rec.calls[id].reentrant = true);
        }
        env.end(
            id,
            Outcome::Ok,
            format!(
                " fence={} valid_until={:.3}{}",
                guard
                    .fencing_token()
                    .map_or("-".to_owned(), |t| t.to_string()),
                env.micros(guard.valid_until()) as f64 / 1000.0,
                if reentrant { " reentrant" } else { "" }
            ),
        );
        if let (Some(token), false) = (guard.fencing_token(), reentrant) {
            env.fence(FenceUse {
                key: name.to_owned(),
                token,
                at: start,
                call_start: Some(call_start),
                call: id,
            });
        }
        let held = [(*guard).clone()];
        let ended = self.body(&held, &op.steps).await;
        let (end, why) = self.ends_now(&held, ended);
        let fence = guard.fencing_token();
        let release = env.begin(Call {
            wait: self.release_allowance(&held),
            ..self.call(op, "release", vec![(name.to_owned(), mode)], nested)
        });
        let released = cancellable(op.cancel.map(|c| c * 3), guard.release()).await;
        let outcome = match released {
            None => Outcome::Cancelled,
            Some(Ok(())) => Outcome::Ok,
            Some(Err(error)) => Outcome::from_error(&error),
        };
        env.end(release, outcome.clone(), String::new());
        if !reentrant {
            env.hold(Hold {
                call: id,
                client: self.client,
                task: self.task,
                key: name.to_owned(),
                mode,
                start,
                end,
                fence,
                released: Some(outcome),
                why_ended: why,
                renewed: held[0].is_renewed(),
                let_go: env.now(),
            });
        }
    }

    /// `Lock::run` (or the attribute's entry) with a body made by `body`
    /// from the held lock; the body returns when its hold ended by its own
    /// account (`None`: still valid).
    async fn single_run<B, F>(
        &self,
        op: &Op,
        lock: &Lock,
        name: &str,
        mode: Mode,
        nested: bool,
        body: B,
    ) where
        B: FnOnce(HeldLock) -> F,
        F: Future<Output = Option<(Micros, &'static str)>>,
    {
        let env = self.env;
        let call = self.call(op, "run", vec![(name.to_owned(), mode)], nested);
        let call_start = call.start;
        let id = env.begin(call);
        let seen: Mutex<Option<Seen>> = Mutex::new(None);
        let inner = async {
            let held = lock_runtime::current().expect("a body sees its lock");
            let start = env.now();
            env.granted(id, env.micros(held.valid_until()), held.passed_in_process());
            *seen.lock().unwrap() = Some(Seen {
                start,
                held: held.clone(),
                ended: None,
                release: None,
            });
            env.end(
                id,
                Outcome::Ok,
                format!(
                    " fence={} valid_until={:.3}",
                    held.fencing_token()
                        .map_or("-".to_owned(), |t| t.to_string()),
                    env.micros(held.valid_until()) as f64 / 1000.0
                ),
            );
            if let Some(token) = held.fencing_token() {
                env.fence(FenceUse {
                    key: name.to_owned(),
                    token,
                    at: start,
                    call_start: Some(call_start),
                    call: id,
                });
            }
            let ended = body(held.clone()).await;
            let ended = self.ends_now(std::slice::from_ref(&held), ended);
            // The rest of the run (its release) is a call of its own.
            let release = env.begin(Call {
                wait: self.release_allowance(std::slice::from_ref(&held)),
                ..self.call(op, "run-release", vec![(name.to_owned(), mode)], nested)
            });
            if let Some(seen) = seen.lock().unwrap().as_mut() {
                seen.ended = Some(ended);
                seen.release = Some(release);
            }
            Ok::<(), LockError>(())
        };
        let ran = match op.api {
            Api::Attribute => {
                cancellable(
                    op.cancel,
                    lock_runtime::__private::run(
                        lock.clone(),
                        "lock_sim::task",
                        "sim:<key>",
                        inner,
                        not_acquired,
                    ),
                )
                .await
            }
            _ => {
                cancellable(op.cancel, async {
                    lock.run(inner).await.and_then(|inner| inner)
                })
                .await
            }
        };
        let seen = seen.lock().unwrap().take();
        let Some(seen) = seen else {
            // The body never ran: the acquisition's outcome.
            let outcome = match ran {
                None => Outcome::Cancelled,
                Some(Ok(())) => Outcome::Config("a run returned without its body".into()),
                Some(Err(error)) => Outcome::from_error(&error),
            };
            return env.end(id, outcome, String::new());
        };
        let (end, why) = match seen.ended {
            Some(ended) => ended,
            // Dropped (cancelled) or stopped on loss in the middle.
            None => self.ends_now(std::slice::from_ref(&seen.held), None),
        };
        let outcome = match &ran {
            None => Outcome::Cancelled,
            Some(Ok(())) => Outcome::Ok,
            Some(Err(error)) => Outcome::from_error(error),
        };
        if let Some(release) = seen.release {
            env.end(release, outcome.clone(), String::new());
        }
        env.hold(Hold {
            call: id,
            client: self.client,
            task: self.task,
            key: name.to_owned(),
            mode,
            start: seen.start,
            end,
            fence: seen.held.fencing_token(),
            released: Some(outcome),
            why_ended: why,
            renewed: seen.held.is_renewed(),
            let_go: env.now(),
        });
    }

    /// A set of exclusive locks, `Lock::all`.
    async fn set(&self, op: &Op, names: &[String]) {
        let env = self.env;
        let client = env.clients[self.client].clone();
        let mut set = Lock::all(names.iter().cloned()).ttl(op.ttl).client(client);
        if let Some(wait) = op.wait {
            set = set.wait(wait);
        }
        if op.renew {
            set = set.renew();
        }
        if op.fair {
            set = set.fair();
        }
        if op.fencing {
            set = set.fencing();
        }
        if let Some(at_least) = op.hold_at_least {
            set = set.hold_at_least(at_least);
        }
        let keys: Vec<(String, Mode)> = names
            .iter()
            .map(|name| (name.clone(), Mode::Exclusive))
            .collect();
        let try_only = op.wait.is_none();
        let mut call = self.call(
            op,
            if try_only { "try" } else { "acquire" },
            keys.clone(),
            false,
        );
        call.set = true;
        let call_start = call.start;
        let id = env.begin(call);
        let acquired = cancellable(op.cancel, async {
            if try_only {
                set.try_acquire().await
            } else {
                set.acquire().await
            }
        })
        .await;
        let guard = match acquired {
            None => return env.end(id, Outcome::Cancelled, String::new()),
            Some(Err(error)) => return env.end(id, Outcome::from_error(&error), String::new()),
            Some(Ok(guard)) => guard,
        };
        let start = env.now();
        let held: Vec<HeldLock> = guard.locks().cloned().collect();
        if let Some(until) = held.iter().map(|lock| env.micros(lock.valid_until())).min() {
            env.granted(id, until, false);
        }
        env.end(
            id,
            Outcome::Ok,
            format!(
                " fence={}",
                guard
                    .fencing_token()
                    .map_or("-".to_owned(), |t| t.to_string())
            ),
        );
        if let Some(token) = guard.fencing_token() {
            for name in names {
                env.fence(FenceUse {
                    key: name.clone(),
                    token,
                    at: start,
                    call_start: Some(call_start),
                    call: id,
                });
            }
        }
        let ended = self.body(&held, &op.steps).await;
        let (end, why) = self.ends_now(&held, ended);
        let fence = guard.fencing_token();
        let release = env.begin(Call {
            wait: self.release_allowance(&held),
            set: true,
            ..self.call(op, "release", keys.clone(), false)
        });
        let released = cancellable(op.cancel.map(|c| c * 3), guard.release()).await;
        let outcome = match released {
            None => Outcome::Cancelled,
            Some(Ok(())) => Outcome::Ok,
            Some(Err(error)) => Outcome::from_error(&error),
        };
        env.end(release, outcome.clone(), String::new());
        for held in &held {
            env.hold(Hold {
                call: id,
                client: self.client,
                task: self.task,
                key: held.name().to_owned(),
                mode: Mode::Exclusive,
                start,
                end,
                fence,
                released: Some(outcome.clone()),
                why_ended: why,
                renewed: held.is_renewed(),
                let_go: env.now(),
            });
        }
    }

    /// x { y { all([x, y]).fencing() { body } } }.
    async fn nested(&self, op: &Op, x: &str, y: &str) {
        let lock_x = self.lock(op, x, Mode::Exclusive);
        let op_y = Op {
            cancel: None,
            wait: op.wait.map(|_| Duration::from_millis(50)),
            ..op.clone()
        };
        let lock_y = self.lock(&op_y, y, Mode::Exclusive);
        let op_y = &op_y;
        self.single_run(op, &lock_x, x, Mode::Exclusive, false, |_outer| async {
            self.single_run(
                op_y,
                &lock_y,
                y,
                Mode::Exclusive,
                true,
                |inner| async move { self.reentrant_set(op_y, x, y, inner).await },
            )
            .await;
            None
        })
        .await;
    }

    /// A fenced set of locks all held further up this task.
    async fn reentrant_set(
        &self,
        op: &Op,
        x: &str,
        y: &str,
        inner: HeldLock,
    ) -> Option<(Micros, &'static str)> {
        let env = self.env;
        let client = env.clients[self.client].clone();
        let set = Lock::all([x.to_owned(), y.to_owned()])
            .fencing()
            .client(client);
        let mut call = self.call(
            op,
            "run",
            vec![
                (x.to_owned(), Mode::Exclusive),
                (y.to_owned(), Mode::Exclusive),
            ],
            true,
        );
        call.set = true;
        call.reentrant = true;
        let id = env.begin(call);
        let held = [inner];
        let result = set
            .run(async {
                let token = lock_runtime::current().and_then(|lock| lock.fencing_token());
                env.end(
                    id,
                    Outcome::Ok,
                    format!(
                        " fence={}",
                        token.map_or("-".into(), |t: u64| t.to_string())
                    ),
                );
                if let Some(token) = token {
                    let at = env.now();
                    for key in [x, y] {
                        env.fence(FenceUse {
                            key: key.to_owned(),
                            token,
                            at,
                            call_start: None,
                            call: id,
                        });
                    }
                }
                self.body(&held, &op.steps).await
            })
            .await;
        match result {
            Ok(ended) => ended,
            Err(error) => {
                let ended = env.shared.with(|world| world.rec.calls[id].end.is_some());
                if !ended {
                    env.end(id, Outcome::from_error(&error), String::new());
                }
                None
            }
        }
    }
}

/// What a `run`'s body saw.
struct Seen {
    start: Micros,
    held: HeldLock,
    ended: Option<(Micros, &'static str)>,
    release: Option<usize>,
}

fn not_acquired(error: LockError, _function: &'static str) -> Result<(), LockError> {
    Err(error)
}
