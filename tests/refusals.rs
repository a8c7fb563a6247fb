//! Every refusal names its real cause (issue 30): a Redis user missing one
//! command of the guide's minimal ACL rule (Configuration) gets, at once, a permission
//! error naming that command and the rule to add, whether the command is
//! sent by the client or run inside a script; a renewal refused for a
//! permission is a loss with that cause, logged once; a user that may not
//! subscribe or publish is told once, naming the permission, and its waiters
//! still get the lock by polling.

mod common;
use common::*;
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lock_runtime::{Client, Config, Lock, LockError, LostCause, RwLock, Semaphore};
use tracing_subscriber::fmt::MakeWriter;

/// What a `fmt` subscriber wrote.
#[derive(Clone, Default)]
struct Output(Arc<Mutex<Vec<u8>>>);

impl Output {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }

    fn warns(&self) -> Vec<String> {
        self.text()
            .lines()
            .filter(|line| line.contains(" WARN "))
            .map(str::to_owned)
            .collect()
    }
}

impl Write for Output {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for Output {
    type Writer = Output;

    fn make_writer(&'a self) -> Output {
        self.clone()
    }
}

/// A default `fmt` subscriber for this thread, writing to `output`.
fn fmt_into(output: &Output) -> tracing::subscriber::DefaultGuard {
    tracing::subscriber::set_default(
        tracing_subscriber::fmt()
            .with_writer(output.clone())
            .with_ansi(false)
            .finish(),
    )
}

/// The guide's minimal rule (Configuration) without `without` (a command such as `rpush`,
/// or a whole item such as `&lock-waiters:*`), for a user whose password is
/// `secret`.
fn rule_without(without: &str) -> Vec<&'static str> {
    let mut rule = vec!["on", ">secret"];
    rule.extend(
        test_support::LOCK_ACL
            .iter()
            .copied()
            .filter(|item| *item != without && item.strip_prefix('+') != Some(without)),
    );
    rule
}

/// A client of the user `name`, (re)made with `rule`.
fn user(server: &RedisServer, name: &str, rule: &[&str]) -> Client {
    let mut args = vec!["ACL", "SETUSER", name, "reset"];
    args.extend_from_slice(rule);
    let reply = redis(server, &args);
    assert!(reply.starts_with("+OK"), "{reply}");
    let url = format!("redis://{name}:secret@127.0.0.1:{}/", server.port());
    Client::new(Config::new(url)).unwrap()
}

/// The commands of the guide's minimal rule that the lock scripts run,
/// read from the scripts themselves (`redis.call('CMD'`). `publish` and
/// `spublish` are left out: a refused message is not an error (tested
/// below), and `spublish` runs only on a cluster.
fn script_commands() -> Vec<&'static str> {
    let dir = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../lock-runtime/src/backend/lua"
    );
    // The locks' scripts; not record.lua, the holder record, written in
    // the background (without its commands locks work, with a warning).
    let mut sources = String::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.file_name().is_some_and(|name| name == "record.lua") {
            continue;
        }
        sources.push_str(&std::fs::read_to_string(path).unwrap());
    }
    let commands: Vec<&'static str> = test_support::LOCK_ACL
        .iter()
        .filter_map(|item| item.strip_prefix('+'))
        .filter(|command| !matches!(*command, "publish" | "spublish"))
        .filter(|command| sources.contains(&format!("'{}'", command.to_ascii_uppercase())))
        .collect();
    assert!(commands.len() >= 15, "{commands:?}");
    commands
}

/// Runs every kind of script call a client makes on one server, as `user`
/// (with `full`, a client of the default user, for the other side of each
/// contention), and returns the first failure.
async fn every_script(
    server: &RedisServer,
    user: &Client,
    full: &Client,
    quorum: &Client,
) -> Result<(), LockError> {
    let ttl = Duration::from_millis(600);
    let busy_wait = Duration::from_millis(300);
    // A dead waiter at the head of the next queue: pruned (LPOP) by the
    // next acquire that reads it.
    redis(
        server,
        &["RPUSH", "lock:{all:x}:queue", "lock-waiters:gone|dead"],
    );
    redis(
        server,
        &[
            "ZADD",
            "lock:{all:x}:waiters",
            "1",
            "lock-waiters:gone|dead",
        ],
    );
    // Exclusive: a plain acquire and release; with fencing, renewed (a
    // renewal refused is a loss, returned by the release).
    Lock::new("all:x")
        .client(user.clone())
        .try_acquire()
        .await?
        .release()
        .await?;
    let renewed = Lock::new("all:x")
        .ttl(ttl)
        .fencing()
        .renew()
        .client(user.clone())
        .try_acquire()
        .await?;
    // A second renewal is sent only once the first one's reply is in.
    let (sent, lost) = (
        user.renewal_stats().renewals_sent,
        user.renewal_stats().lost,
    );
    wait_until_async("a renewal is answered", LINE_TIMEOUT, || {
        let stats = user.renewal_stats();
        stats.renewals_sent >= sent + 2 || stats.lost > lost
    })
    .await;
    renewed.release().await?;
    // Waiting: queued behind `full`'s hold and given up (LEAVE), then
    // queued again and served.
    let held = Lock::new("all:x")
        .client(full.clone())
        .try_acquire()
        .await
        .unwrap();
    match Lock::new("all:x")
        .wait(busy_wait)
        .client(user.clone())
        .acquire()
        .await
    {
        Err(LockError::WaitTimeout { .. }) => {}
        Err(error) => return Err(error),
        Ok(_) => panic!("the lock is held"),
    }
    held.release().await.unwrap();
    let held = Lock::new("all:served")
        .client(full.clone())
        .try_acquire()
        .await
        .unwrap();
    let waiting = spawn_waiter(user, "all:served", LINE_TIMEOUT);
    wait_until_async("the waiter queues", LINE_TIMEOUT, || {
        redis(server, &["LLEN", "lock:{all:served}:queue"]) == ":1\r\n" || waiting.is_finished()
    })
    .await;
    held.release().await.unwrap();
    tokio::time::timeout(LINE_TIMEOUT, waiting)
        .await
        .unwrap()
        .unwrap()?
        .release()
        .await?;
    // A set (acquire_all.lua): taken and released; then waiting behind
    // `full`'s hold of one of its keys (queued in both) and given up.
    let set = Lock::all(["all:s1", "all:s2"]).client(user.clone());
    set.try_acquire().await?.release().await?;
    let held = Lock::new("all:s2")
        .client(full.clone())
        .try_acquire()
        .await
        .unwrap();
    match set.clone().wait(busy_wait).acquire().await {
        Err(LockError::WaitTimeout { .. }) => {}
        Err(error) => return Err(error),
        Ok(_) => panic!("all:s2 is held"),
    }
    held.release().await.unwrap();
    // Read/write: two readers (the lone reader's key, then the readers'
    // set, renewed), a writer queued and given up, the releases.
    let rw = RwLock::new("all:rw").client(user.clone());
    let first = rw.read().try_acquire().await?;
    let second = rw.clone().ttl(ttl).renew().read().try_acquire().await?;
    match rw.write().wait(busy_wait).acquire().await {
        Err(LockError::WaitTimeout { .. }) => {}
        Err(error) => return Err(error),
        Ok(_) => panic!("read-held"),
    }
    let (sent, lost) = (
        user.renewal_stats().renewals_sent,
        user.renewal_stats().lost,
    );
    wait_until_async("the read share's renewal is answered", LINE_TIMEOUT, || {
        let stats = user.renewal_stats();
        stats.renewals_sent >= sent + 2 || stats.lost > lost
    })
    .await;
    first.release().await?;
    second.release().await?;
    rw.write().try_acquire().await?.release().await?;
    // Semaphore: permits taken, a waiter given up, released.
    let semaphore = Semaphore::new("all:sem", 1).client(user.clone());
    let permit = semaphore.try_acquire().await?;
    match semaphore.clone().wait(busy_wait).acquire().await {
        Err(LockError::WaitTimeout { .. }) => {}
        Err(error) => return Err(error),
        Ok(_) => panic!("the permit is taken"),
    }
    permit.release().await?;
    // Over a quorum (its own scripts): fencing, renewed, released.
    let over_quorum = Lock::new("all:q")
        .ttl(ttl)
        .fencing()
        .renew()
        .client(quorum.clone())
        .try_acquire()
        .await?;
    let (sent, lost) = (
        quorum.renewal_stats().renewals_sent,
        quorum.renewal_stats().lost,
    );
    wait_until_async(
        "the quorum lock's renewal is answered",
        LINE_TIMEOUT,
        || {
            let stats = quorum.renewal_stats();
            stats.renewals_sent >= sent + 2 || stats.lost > lost
        },
    )
    .await;
    over_quorum.release().await?;
    Ok(())
}

/// Whether `message` names `command` as a permission missing, with the
/// rule to add, and no advice that blames the connection.
fn names_the_permission(message: &str, command: &str) -> bool {
    let named =
        message.contains(&format!("`{command}`")) || message.contains(&format!("'{command}'"));
    named && message.contains("lacks a permission") && !message.contains("check that Redis is up")
}

/// A user missing each command the scripts run, one at a time: an
/// operation fails at once with a permission error naming the command (a
/// renewal refused: a loss with that cause), never Redis's raw "can't run
/// this command" alone, nor "check that Redis is up".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_missing_each_command_of_the_scripts_is_told_which() {
    let servers = [
        RedisServer::start(),
        RedisServer::start(),
        RedisServer::start(),
    ];
    let server = &servers[0];
    let full = Client::new(Config::new(server.url())).unwrap();
    // The user on every server; its client of the first, and of all three
    // as a quorum.
    let clients = |name: &str, rule: &[&str]| {
        for other in &servers[1..] {
            user(other, name, rule);
        }
        let hosts: Vec<String> = servers
            .iter()
            .map(|server| format!("127.0.0.1:{}", server.port()))
            .collect();
        let quorum = format!("redis-quorum://{name}:secret@{}", hosts.join(","));
        (
            user(server, name, rule),
            Client::new(Config::new(quorum)).unwrap(),
        )
    };
    // The whole rule runs every script.
    let (allowed, quorum) = clients("all-of-it", &rule_without("none"));
    every_script(server, &allowed, &full, &quorum)
        .await
        .unwrap();
    for command in script_commands() {
        for server in &servers {
            redis(server, &["FLUSHALL"]);
        }
        let (lacking, quorum) = clients(&format!("no-{command}"), &rule_without(command));
        let started = Instant::now();
        let error = every_script(server, &lacking, &full, &quorum)
            .await
            .expect_err(command);
        let took = started.elapsed();
        let message = error.to_string();
        match &error {
            LockError::Redis { source, .. } => {
                assert_eq!(
                    source.kind(),
                    redis::ErrorKind::Server(redis::ServerErrorKind::NoPerm),
                    "{command}: {message}"
                );
                assert!(
                    names_the_permission(&message, command),
                    "{command}: {message}"
                );
                assert!(
                    message.contains(&format!("+{command}"))
                        || message.contains(&format!("'{command}'")),
                    "{command}: {message}"
                );
            }
            LockError::Lost { cause, .. } => {
                assert_eq!(*cause, LostCause::PermissionDenied, "{command}: {message}");
            }
            other => panic!("{command}: {other:?}"),
        }
        // At once: not retried until a deadline (the workload's own waits
        // and renewals take about 2 s at most).
        assert!(took < Duration::from_secs(10), "{command}: took {took:?}");
    }
}

/// A renewal refused because the user lost a permission while holding
/// (`pexpire`, then `eval`): the holder is told at once, with that cause,
/// the loss is logged once at warn naming the command, and
/// `renewal_stats()` counts it as refused.
#[tokio::test(flavor = "current_thread")]
async fn a_renewal_refused_for_a_permission_is_lost_with_that_cause() {
    let output = Output::default();
    let _default = fmt_into(&output);
    let server = RedisServer::start();
    for (n, command) in ["pexpire", "eval"].into_iter().enumerate() {
        let name = format!("renewer-{command}");
        let client = user(&server, &name, &rule_without("none"));
        let lock = format!("refused:{command}");
        let result = Lock::new(&lock)
            .ttl(Duration::from_secs(3))
            .renew()
            .client(client.clone())
            .run(async {
                // The rule loses the command while the lock is held.
                let reply = redis(&server, &["ACL", "SETUSER", &name, &format!("-{command}")]);
                assert!(reply.starts_with("+OK"), "{reply}");
                std::future::pending::<()>().await
            })
            .await;
        match &result {
            Err(LockError::Lost {
                cause: LostCause::PermissionDenied,
                ..
            }) => {}
            other => panic!("{command}: {other:?}"),
        }
        let message = result.unwrap_err().to_string();
        assert!(message.contains("permission"), "{message}");
        assert!(!message.contains("unreachable"), "{message}");
        let stats = client.renewal_stats();
        assert_eq!((stats.lost, stats.refused), (1, 1), "{stats:?}");
        let losses: Vec<String> = output
            .warns()
            .into_iter()
            .filter(|line| line.contains("lock lost"))
            .collect();
        assert_eq!(losses.len(), n + 1, "one warn per loss:\n{}", output.text());
        let warn = losses.last().unwrap();
        for expected in [
            "lock.hold{".to_owned(),
            lock.clone(),
            "permission_denied".to_owned(),
            command.to_string(),
        ] {
            assert!(warn.contains(&expected), "{expected}: {warn}");
        }
    }
}

/// A user that may not subscribe: its waiters are still served, by
/// polling, and it says so once, at warn, naming the permission, however
/// many waiters come and go.
#[tokio::test(flavor = "current_thread")]
async fn a_user_that_may_not_subscribe_is_told_once_and_polls() {
    let output = Output::default();
    let _default = fmt_into(&output);
    let server = RedisServer::start();
    let full = Client::new(Config::new(server.url())).unwrap();
    let waiter = user(&server, "no-subscribe", &rule_without("subscribe"));
    let mut latencies = Vec::new();
    for _ in 0..3 {
        let held = Lock::new("polled")
            .client(full.clone())
            .try_acquire()
            .await
            .unwrap();
        let waiting = spawn_waiter(&waiter, "polled", LINE_TIMEOUT);
        wait_until_async("the waiter queues", LINE_TIMEOUT, || {
            redis(&server, &["LLEN", "lock:{polled}:queue"]) == ":1\r\n"
        })
        .await;
        let released = Instant::now();
        held.release().await.unwrap();
        let guard = waited(waiting).await;
        latencies.push(released.elapsed());
        guard.release().await.unwrap();
    }
    eprintln!("woken without subscribe after {latencies:?}");
    let said: Vec<String> = output
        .warns()
        .into_iter()
        .filter(|line| line.contains("subscribe"))
        .collect();
    assert_eq!(said.len(), 1, "{}", output.text());
    assert!(
        said[0].contains("`subscribe`") && said[0].contains("poll"),
        "{}",
        said[0]
    );
}

/// A holder whose user may not publish (the command, or the channel
/// pattern): its release succeeds (the key is deleted, no error, nothing
/// retried), it says so once at warn naming the permission, and the waiter
/// of another process gets the lock by polling.
#[tokio::test(flavor = "current_thread")]
async fn a_user_that_may_not_publish_releases_and_is_told_once() {
    let output = Output::default();
    let _default = fmt_into(&output);
    let server = RedisServer::start();
    let full = Client::new(Config::new(server.url())).unwrap();
    for (without, named) in [
        ("publish", "`publish`"),
        ("&lock-waiters:*", "`&lock-waiters:*`"),
    ] {
        let holder = user(&server, "no-publish", &rule_without(without));
        for kind in ["exclusive", "rw", "semaphore"] {
            let name = format!("unpublished-{kind}");
            match kind {
                "exclusive" => {
                    let held = Lock::new(&name)
                        .client(holder.clone())
                        .try_acquire()
                        .await
                        .unwrap();
                    let waiting = spawn_waiter(&full, &name, LINE_TIMEOUT);
                    let queue = format!("lock:{{{name}}}:queue");
                    wait_until_async("the waiter queues", LINE_TIMEOUT, || {
                        redis(&server, &["LLEN", &queue]) == ":1\r\n"
                    })
                    .await;
                    held.release().await.unwrap();
                    waited(waiting).await.release().await.unwrap();
                }
                "rw" => {
                    let rw = RwLock::new(&name);
                    let held = rw
                        .clone()
                        .client(holder.clone())
                        .write()
                        .try_acquire()
                        .await
                        .unwrap();
                    let waiting = tokio::spawn({
                        let lock = rw.clone().client(full.clone()).read().wait(LINE_TIMEOUT);
                        async move { lock.acquire().await }
                    });
                    let queue = format!("lock:{{{name}}}:rw:queue");
                    wait_until_async("the reader queues", LINE_TIMEOUT, || {
                        redis(&server, &["LLEN", &queue]) == ":1\r\n"
                    })
                    .await;
                    held.release().await.unwrap();
                    waited(waiting).await.release().await.unwrap();
                }
                _ => {
                    let semaphore = Semaphore::new(&name, 1);
                    let held = semaphore
                        .clone()
                        .client(holder.clone())
                        .try_acquire()
                        .await
                        .unwrap();
                    let waiting = tokio::spawn({
                        let lock = semaphore.clone().client(full.clone()).wait(LINE_TIMEOUT);
                        async move { lock.acquire().await }
                    });
                    let queue = format!("lock:{{{name}}}:sem:queue");
                    wait_until_async("the permit waiter queues", LINE_TIMEOUT, || {
                        redis(&server, &["LLEN", &queue]) == ":1\r\n"
                    })
                    .await;
                    held.release().await.unwrap();
                    waited(waiting).await.release().await.unwrap();
                }
            }
        }
        let said: Vec<String> = output
            .warns()
            .into_iter()
            .filter(|line| line.contains("may not publish") && line.contains(named))
            .collect();
        assert_eq!(said.len(), 1, "{without}: {}", output.text());
    }
    // Nothing failed, nothing else warned: the two warnings, one per user.
    let text = output.text();
    assert!(!text.contains(" ERROR "), "{text}");
    assert_eq!(output.warns().len(), 2, "{text}");
}
