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

/// Runs `lockctl list` until `ready` holds for its output (the holder
/// record is written once a hold has lasted a second).
pub async fn list_until(url: &str, what: &str, ready: impl Fn(&Run) -> bool) -> Run {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let list = lockctl(url, &["list"], "").await;
        if ready(&list) {
            return list;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting until {what}: {list:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The row of `name` in a `list` table, as its cells by column name
/// (`row["HOLDER"]`): cut at the header's column starts (cells are padded to
/// their column's width, and may hold spaces).
pub fn row(table: &str, name: &str) -> Option<Row> {
    let mut lines = table.lines();
    let header: Vec<char> = lines.next()?.chars().collect();
    let mut starts = Vec::new();
    for (at, c) in header.iter().enumerate() {
        if *c != ' ' && (at == 0 || header[at - 1] == ' ') {
            let end = header[at..]
                .iter()
                .position(|c| *c == ' ')
                .map_or(header.len(), |len| at + len);
            starts.push((at, header[at..end].iter().collect::<String>()));
        }
    }
    let line: Vec<char> = lines
        .find(|line| line.split_whitespace().next() == Some(name))?
        .chars()
        .collect();
    let cells = starts
        .iter()
        .enumerate()
        .map(|(i, (start, column))| {
            let end = starts.get(i + 1).map_or(line.len(), |(next, _)| *next);
            let cell: String = line
                .get(*start.min(&line.len())..end.min(line.len()))
                .unwrap_or_default()
                .iter()
                .collect();
            (column.clone(), cell.trim().to_owned())
        })
        .collect();
    Some(Row(cells))
}

/// A table row's cells by column name.
#[derive(Debug)]
pub struct Row(std::collections::BTreeMap<String, String>);

impl std::ops::Index<&str> for Row {
    type Output = String;

    fn index(&self, column: &str) -> &String {
        self.0
            .get(column)
            .unwrap_or_else(|| panic!("no column {column} in {self:?}"))
    }
}
