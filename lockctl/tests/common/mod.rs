//! Running the `lockctl` binary as an OS process against private
//! redis-server processes (test-support).
#![allow(dead_code)]

use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use lock_runtime::{Client, Config, Lock, LockError, LockGuard};

/// Generous bound for anything that should happen at once.
pub const PATIENCE: Duration = Duration::from_secs(20);

/// What one run of lockctl printed, and its exit code.
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    pub fn all(&self) -> String {
        format!("{}{}", self.stdout, self.stderr)
    }
}

impl std::fmt::Debug for Run {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "exit {}\n--- stdout\n{}--- stderr\n{}",
            self.code, self.stdout, self.stderr
        )
    }
}

/// The longest one run of lockctl may take (each does a few calls, or a
/// `watch` of a few refreshes): a run that hangs is killed, and the test
/// fails with what it printed.
pub const RUN_TIMEOUT: Duration = Duration::from_secs(60);

/// Runs `lockctl --url <url> <args>` (REDIS_URL unset), with `stdin`
/// written to its input (then closed). Panics if it has not exited within
/// [`RUN_TIMEOUT`] (it is killed).
pub fn lockctl_sync(url: &str, args: &[&str], stdin: &str) -> Run {
    let mut child = Command::new(env!("CARGO_BIN_EXE_lockctl"))
        .arg("--url")
        .arg(url)
        .args(args)
        .env_remove("REDIS_URL")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("lockctl runs");
    let mut input = child.stdin.take().unwrap();
    // A run that never reads its input may close it first.
    let _ = input.write_all(stdin.as_bytes());
    drop(input);
    // Read apart, so that neither pipe fills up while the other is read.
    fn drain(mut pipe: impl Read + Send + 'static) -> std::thread::JoinHandle<String> {
        std::thread::spawn(move || {
            let mut text = Vec::new();
            let _ = pipe.read_to_end(&mut text);
            String::from_utf8_lossy(&text).into_owned()
        })
    }
    let stdout = drain(child.stdout.take().unwrap());
    let stderr = drain(child.stderr.take().unwrap());
    let deadline = Instant::now() + RUN_TIMEOUT;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let (stdout, stderr) = (stdout.join().unwrap(), stderr.join().unwrap());
    let Some(status) = status else {
        panic!(
            "lockctl {args:?} did not exit within {RUN_TIMEOUT:?} (killed)\n--- stdout\n{stdout}--- stderr\n{stderr}"
        );
    };
    Run {
        code: status.code().unwrap_or(-1),
        stdout,
        stderr,
    }
}

/// [`lockctl_sync`] off the runtime's threads (waiters of the test keep
/// running meanwhile).
pub async fn lockctl(url: &str, args: &[&str], stdin: &str) -> Run {
    let (url, stdin) = (url.to_owned(), stdin.to_owned());
    let args: Vec<String> = args.iter().map(|arg| arg.to_string()).collect();
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        lockctl_sync(&url, &args, &stdin)
    })
    .await
    .unwrap()
}

pub fn client(url: &str) -> Client {
    Client::new(Config::new(url)).unwrap()
}

/// A task of `client` waiting up to a long while for `name`.
pub fn spawn_waiter(
    client: &Client,
    name: &str,
) -> tokio::task::JoinHandle<Result<LockGuard, LockError>> {
    let lock = Lock::new(name).wait(PATIENCE).client(client.clone());
    tokio::spawn(async move { lock.acquire().await })
}

/// Waits (bounded) until `condition` holds.
pub async fn wait_until(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The channel of the one waiter queued in `queue` (its entry is
/// `<channel>|<token>`), given the reply of `LRANGE queue 0 -1`: where a
/// release tells it.
pub fn queued_channel(lrange: &str) -> String {
    let entries: Vec<&str> = lrange
        .split("\r\n")
        .filter(|line| !line.is_empty() && !line.starts_with(['*', '$']))
        .collect();
    assert_eq!(entries.len(), 1, "one waiter queued: {lrange:?}");
    let (channel, _token) = entries[0].rsplit_once('|').expect("<channel>|<token>");
    channel.to_owned()
}

/// The subscriber count of a `PUBSUB NUMSUB channel` (or `SHARDNUMSUB`)
/// reply.
pub fn numsub(reply: &str) -> u64 {
    let count = reply.rsplit(':').next().unwrap_or_default();
    count.trim().parse().unwrap_or_else(|_| panic!("{reply:?}"))
}

/// The row of `name` in a `list` table, split into its columns (the
/// holder column may hold spaces: it is the fifth to the one before last).
pub fn row(table: &str, name: &str) -> Option<Vec<String>> {
    table
        .lines()
        .find(|line| line.split_whitespace().next() == Some(name))
        .map(|line| line.split_whitespace().map(str::to_owned).collect())
}
