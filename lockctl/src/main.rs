//! `lockctl`: list, show, force-release and watch the locks of
//! lock-runtime. A thin command line over `lock_runtime::admin` (the
//! `Client` methods `inspect`, `lock_info`, `release_holder`): everything
//! it does, a program can do through the library.
//!
//! See the README, "Operating: lockctl".

mod args;
mod output;

use std::io::{IsTerminal, Write};
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lock_runtime::admin::{LockInfo, LockKind, ReleaseOutcome};
use lock_runtime::{Client, Config, LockError, REDIS_URL_ENV};

use args::{Command, Global};

/// Exit codes (also in `--help`).
const FAILED: u8 = 1;
const USAGE: u8 = 2;
const NOTHING_RELEASED: u8 = 3;

/// Why lockctl stops with a non-zero code, and what to tell the user.
struct Failure {
    code: u8,
    message: String,
    /// Redis could not be reached or refused: the message names where.
    redis: bool,
}

impl Failure {
    fn new(code: u8, message: impl Into<String>) -> Failure {
        Failure {
            code,
            message: message.into(),
            redis: false,
        }
    }
}

impl From<LockError> for Failure {
    fn from(error: LockError) -> Failure {
        // The library's messages say what happened and what to do, and
        // never carry a password.
        Failure {
            redis: matches!(error, LockError::Redis { .. }),
            ..Failure::new(FAILED, error.to_string())
        }
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
    run_on(&client, global, command)
        .await
        .map_err(|mut failure| {
            if failure.redis {
                // Where, with the password masked.
                failure.message =
                    format!("on {}: {}", client.config().redacted_url(), failure.message);
            }
            failure
        })
}

async fn run_on(client: &Client, global: Global, command: Command) -> Result<(), Failure> {
    match command {
        Command::List { prefix } => {
            let locks = client.inspect(&prefix).await?;
            print(&render(&global, &locks));
            Ok(())
        }
        Command::Show { name } => {
            let locks = client.lock_info(&name).await?;
            let text = if global.json {
                output::json(&locks)
            } else {
                output::details(&name, &locks)
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
    Ok(Client::new(config)?)
}

fn render(global: &Global, locks: &[LockInfo]) -> String {
    if global.json {
        output::json(locks)
    } else {
        output::table(locks)
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
    let locks = client.lock_info(name).await?;
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
            format!("{} ({}, ttl {ttl})", holder.token_head(), holder.role)
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
        let outcome = client.release_holder(name, lock.kind, holder).await?;
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
            clock(),
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
    let mut refresh = 0u64;
    loop {
        refresh += 1;
        let result = client.inspect(prefix).await;
        let mut text = String::new();
        if terminal {
            text.push_str("\x1b[2J\x1b[H"); // clear the screen
        }
        if !global.json {
            let which = if prefix.is_empty() {
                "all locks".to_owned()
            } else {
                format!("locks `{prefix}*`")
            };
            text.push_str(&format!(
                "lockctl watch: {which} on {}, every {}: refresh {refresh} at {}\n",
                client.config().redacted_url(),
                output::duration(interval),
                clock()
            ));
        }
        let last = match result {
            Ok(locks) => {
                text.push_str(&render(global, &locks));
                Ok(())
            }
            Err(error) => Err(Failure::from(error)),
        };
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

/// The time of day, UTC (`14:03:07Z`).
fn clock() -> String {
    let seconds = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_secs());
    format!(
        "{:02}:{:02}:{:02}Z",
        seconds / 3600 % 24,
        seconds / 60 % 60,
        seconds % 60
    )
}
