//! `lockctl`: list, show, force-release and watch the locks of
//! lock-runtime. A thin command line over `lock_runtime::admin` (the
//! `Client` methods `inspect`, `lock_info`, `release_holder`): everything
//! it does, a program can do through the library.
//!
//! See lock_runtime's guide, "Operating: lockctl" (`lock-runtime/src/guide/operating.md`).

mod args;
mod output;

use std::io::{IsTerminal, Write};
use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use lock_runtime::admin::{LockInfo, LockKind, ReleaseOutcome};
use lock_runtime::{Client, Config, ConfigError, LockError, REDIS_URL_ENV};

use args::{Command, Global};

/// Exit codes (also in `--help`).
const FAILED: u8 = 1;
const USAGE: u8 = 2;
const NOTHING_RELEASED: u8 = 3;

/// Why lockctl stops with a non-zero code, and what to tell the user.
struct Failure {
    code: u8,
    message: String,
    /// A library error, told as what lockctl was doing ([`failure`])
    /// (boxed: a `Result` of this stays small).
    error: Option<Box<LockError>>,
}

impl Failure {
    fn new(code: u8, message: impl Into<String>) -> Failure {
        Failure {
            code,
            message: message.into(),
            error: None,
        }
    }

    /// `error` from a call to Redis, to be told as what lockctl was doing.
    fn redis(error: LockError) -> Failure {
        Failure {
            error: Some(Box::new(error)),
            ..Failure::new(FAILED, String::new())
        }
    }
}

/// `error`, met while lockctl tried to `action` (`list the locks`, `read
/// lock `x``) on the Redis at `url` (password masked), as a message that
/// says what failed and how to fix it.
fn failure(action: &str, url: &str, error: LockError) -> Failure {
    let LockError::Redis { source, .. } = &error else {
        return Failure::new(FAILED, format!("cannot {action}: {error}"));
    };
    let advice = if source.is_connection_refusal() {
        format!(
            "nothing accepts connections at {url} ({source}): start Redis there, or give its \
             address with --url or {REDIS_URL_ENV}"
        )
    } else if source.is_timeout() {
        format!(
            "{url} did not answer in time ({source}): check the host, the port and any \
             firewall (a TLS port needs a rediss:// URL); for a slow link, raise --timeout"
        )
    } else if source.kind() == redis::ErrorKind::AuthenticationFailed
        || matches!(source.code(), Some("WRONGPASS" | "NOAUTH"))
    {
        format!(
            "the Redis at {url} refused the credentials ({source}): check the user name and \
             password in the URL"
        )
    } else if source.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoPerm)
        || source.code() == Some("NOPERM")
    {
        format!(
            "the Redis user of {url} lacks a permission ({source}): lockctl needs the \
             library's ACL rule plus +scan +zcount +hgetall (lock_runtime's guide, \"Operating: lockctl\")"
        )
    } else if source.is_io_error() || source.is_connection_dropped() {
        format!(
            "cannot talk to the Redis at {url} ({source}): check the host name and port in \
             --url or {REDIS_URL_ENV}, and that Redis is up"
        )
    } else {
        format!("the Redis at {url} answered with an error: {source}")
    };
    Failure::new(FAILED, format!("cannot {action}: {advice}"))
}

/// The failure of a client that could not be built from the URL: a
/// `rediss://` URL in a build without TLS says how to build lockctl with
/// it.
fn config_failure(error: LockError) -> Failure {
    match error {
        LockError::Config(ConfigError::TlsNotBuiltIn { url }) => Failure::new(
            FAILED,
            format!(
                "`{url}` needs TLS, and this lockctl was built without it: build it with its \
                 `tls-rustls` feature (`cargo install --path lockctl --features tls-rustls`, \
                 or in the workspace `cargo build --release -p lockctl --features tls-rustls`), \
                 or use a redis:// URL for a server without TLS"
            ),
        ),
        error => Failure::new(FAILED, error.to_string()),
    }
}

fn main() -> ExitCode {
    let (global, command) = args::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("lockctl: cannot start the Tokio runtime: {error}");
            return ExitCode::from(FAILED);
        }
    };
    match runtime.block_on(run(global, command)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => {
            eprintln!("lockctl: {}", failure.message);
            ExitCode::from(failure.code)
        }
    }
}

async fn run(global: Global, command: Command) -> Result<(), Failure> {
    let client = connect(&global)?;
    let url = client.config().redacted_url();
    let action = match &command {
        Command::List { prefix } | Command::Watch { prefix, .. } => locks_named(prefix),
        Command::Show { name } => format!("read lock `{name}`"),
        Command::Release { name, .. } => format!("release lock `{name}`"),
    };
    // A library error is told as what was being done, and where (the
    // password masked).
    run_on(&client, global, command)
        .await
        .map_err(|failure| match failure.error {
            Some(error) => self::failure(&action, &url, *error),
            None => failure,
        })
}

/// `list the locks` (all, or those whose name starts with `prefix`).
fn locks_named(prefix: &str) -> String {
    if prefix.is_empty() {
        "list the locks".to_owned()
    } else {
        format!("list the locks `{prefix}*`")
    }
}

async fn run_on(client: &Client, global: Global, command: Command) -> Result<(), Failure> {
    match command {
        Command::List { prefix } => {
            let locks = client.inspect(&prefix).await.map_err(Failure::redis)?;
            print(&render(&global, &locks));
            Ok(())
        }
        Command::Show { name } => {
            let locks = client.lock_info(&name).await.map_err(Failure::redis)?;
            if locks.is_empty() {
                if global.json {
                    print("[]\n");
                }
                return Err(Failure::new(
                    FAILED,
                    format!(
                        "lock `{name}` not found: Redis has no key of it (no holder, no waiter, \
                         no fencing counter: it is free)"
                    ),
                ));
            }
            let text = if global.json {
                output::json(&locks)
            } else {
                output::details(&locks, SystemTime::now())
            };
            print(&text);
            Ok(())
        }
        Command::Release {
            name,
            force,
            yes,
            kind,
        } => release(client, &name, force, yes, kind).await,
        Command::Watch {
            prefix,
            interval,
            count,
        } => watch(client, &global, &prefix, interval, count).await,
    }
}

/// The client of `--url` or `REDIS_URL`, with `--key-prefix` and
/// `--timeout`.
fn connect(global: &Global) -> Result<Client, Failure> {
    let url = match &global.url {
        Some(url) => url.clone(),
        None => match std::env::var(REDIS_URL_ENV) {
            Ok(url) if !url.trim().is_empty() => url,
            _ => {
                return Err(Failure::new(
                    USAGE,
                    format!(
                        "no Redis URL: give --url redis://host:6379 (or redis-cluster://..., \
                         redis-quorum://...) or set {REDIS_URL_ENV}"
                    ),
                ))
            }
        },
    };
    let mut config = Config::new(url);
    if let Some(prefix) = &global.key_prefix {
        config = config.key_prefix(prefix.clone());
    }
    if let Some(timeout) = global.timeout {
        config = config.connect_timeout(timeout).response_timeout(timeout);
    }
    Client::new(config).map_err(config_failure)
}

fn render(global: &Global, locks: &[LockInfo]) -> String {
    if global.json {
        output::json(locks)
    } else {
        output::table(locks, SystemTime::now())
    }
}

fn print(text: &str) {
    let mut stdout = std::io::stdout().lock();
    // A closed pipe (`lockctl list | head`) is not an error worth a panic.
    let _ = stdout.write_all(text.as_bytes());
    let _ = stdout.flush();
}

/// `release NAME --force [--yes] [--kind KIND]`: shows what it is about to
/// release, asks, then releases each holder it showed on that holder's
/// behalf (owner-checked: a holder that changed meanwhile keeps the lock).
async fn release(
    client: &Client,
    name: &str,
    force: bool,
    yes: bool,
    kind: Option<LockKind>,
) -> Result<(), Failure> {
    if !force {
        return Err(Failure::new(
            USAGE,
            format!(
                "not released: `release` takes lock `{name}` from its holder, which may still be \
                 running its critical section. Add --force to do it (you are asked to confirm; \
                 --yes skips the question)"
            ),
        ));
    }
    let locks = client.lock_info(name).await.map_err(Failure::redis)?;
    let lock = match kind {
        Some(kind) => locks.into_iter().find(|lock| lock.kind == kind),
        None => {
            let mut held: Vec<LockInfo> = locks.into_iter().filter(LockInfo::is_held).collect();
            if held.len() > 1 {
                let kinds: Vec<&str> = held.iter().map(|lock| lock.kind.as_str()).collect();
                return Err(Failure::new(
                    USAGE,
                    format!(
                        "`{name}` names several held locks ({}): choose one with --kind",
                        kinds.join(", ")
                    ),
                ));
            }
            held.pop()
        }
    };
    let Some(lock) = lock.filter(LockInfo::is_held) else {
        let what = kind.map_or_else(String::new, |kind| format!(" ({kind})"));
        return Err(Failure::new(
            NOTHING_RELEASED,
            format!("lock `{name}`{what} is not held: nothing released"),
        ));
    };
    let holders: Vec<_> = lock.holding().cloned().collect();
    let who: Vec<String> = holders
        .iter()
        .map(|holder| {
            let ttl = holder
                .ttl
                .map_or_else(|| "no expiry".to_owned(), output::duration);
            let who = holder.record.as_ref().map_or_else(
                || format!("instance {}", output::NO_RECORD),
                |record| {
                    format!(
                        "instance {}, host {}, pid {}, function {}",
                        record.instance,
                        record.host,
                        record
                            .pid
                            .map_or_else(|| "unknown".to_owned(), |pid| pid.to_string()),
                        record.function.as_deref().unwrap_or("unknown")
                    )
                },
            );
            format!(
                "{} ({}, ttl {ttl}; {who})",
                holder.token_head(),
                holder.role
            )
        })
        .collect();
    eprintln!(
        "lock `{name}` ({}) is held by {}; {} waiter(s) queued. A holder's process is not \
         stopped: it learns of the release at its next renewal or release, and may still be \
         running its critical section.",
        lock.kind,
        who.join(", "),
        lock.waiters
    );
    if !yes && !confirm(&format!("Release `{name}` ({})? [y/N] ", lock.kind)).await {
        return Err(Failure::new(
            NOTHING_RELEASED,
            format!("not confirmed: lock `{name}` was left to its holder"),
        ));
    }
    let mut released = 0;
    for holder in &holders {
        let outcome = client
            .release_holder(name, lock.kind, holder)
            .await
            .map_err(Failure::redis)?;
        if matches!(outcome, ReleaseOutcome::Released { .. }) {
            released += 1;
        }
        let line = format!(
            "lock `{name}` ({}), holder {} ({}): {outcome}",
            lock.kind,
            holder.token_head(),
            holder.role
        );
        // What was done, for the operator (stdout) and the log (stderr).
        println!("{line}");
        eprintln!(
            "lockctl: force release by {} at {} on {}: {line}",
            std::env::var("USER")
                .or_else(|_| std::env::var("LOGNAME"))
                .unwrap_or_else(|_| "an unknown user".to_owned()),
            output::rfc3339(SystemTime::now()),
            client.config().redacted_url()
        );
    }
    if released == 0 {
        return Err(Failure::new(
            NOTHING_RELEASED,
            format!("nothing released: lock `{name}` changed hands or was freed meanwhile"),
        ));
    }
    Ok(())
}

/// Asks `question` on stderr and reads the answer from stdin: only `y`
/// or `yes` agrees; end of input is a no.
async fn confirm(question: &str) -> bool {
    eprint!("{question}");
    let _ = std::io::stderr().flush();
    let answer = tokio::task::spawn_blocking(|| {
        let mut line = String::new();
        std::io::stdin().read_line(&mut line).map(|_| line)
    })
    .await;
    matches!(answer, Ok(Ok(line)) if matches!(line.trim().to_ascii_lowercase().as_str(), "y" | "yes"))
}

/// `watch`: the listing every `interval`, `count` times or until Ctrl-C.
/// A refresh that fails is reported and the next one tried; the exit code
/// is that of the last refresh.
async fn watch(
    client: &Client,
    global: &Global,
    prefix: &str,
    interval: Duration,
    count: Option<u64>,
) -> Result<(), Failure> {
    let terminal = std::io::stdout().is_terminal() && !global.json;
    let url = client.config().redacted_url();
    let mut refresh = 0u64;
    loop {
        refresh += 1;
        let result = client.inspect(prefix).await;
        let now = SystemTime::now();
        let last = result.map_err(|error| failure(&locks_named(prefix), &url, error));
        let mut text = String::new();
        if global.json {
            // One JSON object per line, each with its time.
            let locks = last.as_ref().map(Vec::as_slice);
            let error = last.as_ref().err().map(|failure| failure.message.as_str());
            text = output::watch_line(now, refresh, error.map_or(Ok(locks.unwrap_or(&[])), Err));
        } else {
            if terminal {
                text.push_str("\x1b[2J\x1b[H"); // clear the screen
            }
            let which = if prefix.is_empty() {
                "all locks".to_owned()
            } else {
                format!("locks `{prefix}*`")
            };
            text.push_str(&format!(
                "lockctl watch: {which} on {url}, every {}: refresh {refresh} at {}\n",
                output::duration(interval),
                output::rfc3339(now)
            ));
            if let Ok(locks) = &last {
                text.push_str(&output::table(locks, now));
            }
        }
        let last = last.map(|_| ());
        print(&text);
        if let Err(failure) = &last {
            eprintln!("lockctl: {}", failure.message);
        }
        if count.is_some_and(|count| refresh >= count) {
            return last.map_err(|_| Failure::new(FAILED, "the last refresh failed (see above)"));
        }
        tokio::time::sleep(interval).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whatever features this build has, the advice for a `rediss://` URL
    /// without TLS names lockctl's feature and how to build with it.
    #[test]
    fn tls_not_built_in_says_how_to_build_lockctl() {
        let failure = config_failure(LockError::Config(ConfigError::TlsNotBuiltIn {
            url: "rediss://user:***@h:6380/".to_owned(),
        }));
        assert_eq!(failure.code, FAILED);
        assert!(
            failure
                .message
                .contains("cargo install --path lockctl --features tls-rustls"),
            "{}",
            failure.message
        );
        assert!(failure.message.contains("rediss://user:***@h:6380/"));
    }
}
