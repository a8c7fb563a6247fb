//! A fault-injecting TCP proxy on 127.0.0.1, to put between lock clients and
//! a redis-server and break the network between them for real: drop every
//! connection, close idle ones, add latency, stall, or refuse new ones.
//!
//! Std threads only (no async runtime): one thread accepts, and each
//! connection has one thread per direction. Every wait is bounded by
//! `TICK`, so the threads notice new settings, closed connections and the
//! proxy's drop promptly without spinning.
//!
//! Limitations: latency is applied chunk by chunk on each direction's single
//! thread, so a direction carries at most one chunk (up to 16 KiB) per
//! latency period. Idle time counts forwarded bytes only: a stalled
//! connection is idle, even if bytes wait.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::unix::io::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// The longest any proxy thread waits before looking at its flags again.
const TICK: Duration = Duration::from_millis(5);

/// A TCP proxy from a free port of 127.0.0.1 to a loopback upstream port.
/// Stops its threads and closes every connection when dropped.
pub struct Proxy {
    port: u16,
    shared: Arc<Shared>,
    acceptor: Option<JoinHandle<()>>,
}

/// State shared by the handle, the accepting thread and the pumps.
struct Shared {
    upstream: SocketAddr,
    /// Origin of the connections' activity timestamps.
    epoch: Instant,
    stop: AtomicBool,
    stalled: AtomicBool,
    refusing: AtomicBool,
    latency_nanos: AtomicU64,
    /// 0 means no idle timeout.
    idle_timeout_nanos: AtomicU64,
    accepted: AtomicU64,
    /// Open connections by accept number.
    connections: Mutex<HashMap<u64, Arc<Connection>>>,
}

/// One proxied connection: the accepted client socket and its upstream.
struct Connection {
    client: TcpStream,
    upstream: TcpStream,
    /// Nanoseconds from `Shared::epoch` to the last byte carried.
    last_activity: AtomicU64,
    closed: AtomicBool,
    /// Pump threads still running; the last one out unregisters.
    pumps_left: AtomicUsize,
}

impl Proxy {
    /// Starts a proxy to `127.0.0.1:upstream_port`. Panics if it cannot
    /// listen.
    pub fn start(upstream_port: u16) -> Proxy {
        Self::try_start(upstream_port).unwrap_or_else(|error| panic!("cannot start proxy: {error}"))
    }

    /// Like [`start`](Self::start), returning an error instead of panicking.
    pub fn try_start(upstream_port: u16) -> io::Result<Proxy> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
        listener.set_nonblocking(true)?;
        let port = listener.local_addr()?.port();
        let shared = Arc::new(Shared {
            upstream: SocketAddr::from((Ipv4Addr::LOCALHOST, upstream_port)),
            epoch: Instant::now(),
            stop: AtomicBool::new(false),
            stalled: AtomicBool::new(false),
            refusing: AtomicBool::new(false),
            latency_nanos: AtomicU64::new(0),
            idle_timeout_nanos: AtomicU64::new(0),
            accepted: AtomicU64::new(0),
            connections: Mutex::new(HashMap::new()),
        });
        let acceptor = {
            let shared = shared.clone();
            thread::Builder::new()
                .name(format!("proxy-{port}"))
                .spawn(move || accept_loop(&shared, &listener))?
        };
        Ok(Proxy {
            port,
            shared,
            acceptor: Some(acceptor),
        })
    }

    /// The loopback port the proxy listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The proxy's URL, `redis://127.0.0.1:PORT/`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// Closes every current connection on both sides, as a failover or a
    /// load balancer reset would. New connections are still accepted.
    pub fn drop_all(&self) {
        self.shared.close_all();
    }

    /// Closes (both sides) any connection that carries no bytes in either
    /// direction for `timeout`; `None` turns this off.
    pub fn set_idle_timeout(&self, timeout: Option<Duration>) {
        let nanos = timeout.map_or(0, |timeout| nanos(timeout).max(1));
        self.shared.idle_timeout_nanos.store(nanos, SeqCst);
    }

    /// Delays each chunk of bytes by `latency` before forwarding it, in both
    /// directions. `Duration::ZERO` turns this off.
    pub fn set_latency(&self, latency: Duration) {
        self.shared.latency_nanos.store(nanos(latency), SeqCst);
    }

    /// Stops forwarding in both directions, on existing and new connections,
    /// without closing anything: bytes wait until [`resume`](Self::resume).
    pub fn stall(&self) {
        self.shared.stalled.store(true, SeqCst);
    }

    /// Forwards again, including what waited while stalled.
    pub fn resume(&self) {
        self.shared.stalled.store(false, SeqCst);
    }

    /// While `true`, new connections are accepted and closed at once (like a
    /// Redis that is down behind a load balancer). Existing ones go on.
    pub fn refuse(&self, refuse: bool) {
        self.shared.refusing.store(refuse, SeqCst);
    }

    /// Connections currently open through the proxy.
    pub fn connections(&self) -> usize {
        self.shared.connections().len()
    }

    /// Connections accepted so far, refused ones included.
    pub fn accepted(&self) -> u64 {
        self.shared.accepted.load(SeqCst)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.shared.stop.store(true, SeqCst);
        // Shutting the sockets down also wakes pumps blocked in a write.
        self.shared.close_all();
        if let Some(acceptor) = self.acceptor.take() {
            let _ = acceptor.join();
        }
    }
}

impl Shared {
    fn connections(&self) -> MutexGuard<'_, HashMap<u64, Arc<Connection>>> {
        self.connections
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn close_all(&self) {
        for connection in self.connections().values() {
            connection.close();
        }
    }

    fn now(&self) -> u64 {
        nanos(self.epoch.elapsed())
    }

    /// Whether a pump of `connection` should go on; closes the connection
    /// when it has been idle for too long.
    fn alive(&self, connection: &Connection) -> bool {
        if self.stop.load(SeqCst) || connection.closed.load(SeqCst) {
            return false;
        }
        let timeout = self.idle_timeout_nanos.load(SeqCst);
        let idle = self
            .now()
            .saturating_sub(connection.last_activity.load(SeqCst));
        if timeout != 0 && idle >= timeout {
            connection.close();
            return false;
        }
        true
    }

    /// Holds a chunk until `due` and for as long as the proxy is stalled.
    /// Returns false if the connection should end meanwhile.
    fn hold(&self, connection: &Connection, due: Instant) -> bool {
        loop {
            if !self.alive(connection) {
                return false;
            }
            let now = Instant::now();
            if now >= due && !self.stalled.load(SeqCst) {
                return true;
            }
            thread::sleep(
                due.saturating_duration_since(now)
                    .clamp(Duration::from_micros(100), TICK),
            );
        }
    }
}

impl Connection {
    /// Shuts both sockets down both ways: the peers read end of stream and
    /// the pumps wake up and leave.
    fn close(&self) {
        self.closed.store(true, SeqCst);
        let _ = self.client.shutdown(Shutdown::Both);
        let _ = self.upstream.shutdown(Shutdown::Both);
    }

    fn touch(&self, shared: &Shared) {
        self.last_activity.store(shared.now(), SeqCst);
    }
}

/// Accepts connections until the proxy is dropped, then closes them and
/// waits for their pumps.
fn accept_loop(shared: &Arc<Shared>, listener: &TcpListener) {
    let mut pumps: Vec<JoinHandle<()>> = Vec::new();
    while !shared.stop.load(SeqCst) {
        pumps.retain(|pump| !pump.is_finished());
        if !readable(listener, TICK) {
            continue;
        }
        let Ok((client, _)) = listener.accept() else {
            continue;
        };
        let id = shared.accepted.fetch_add(1, SeqCst);
        if shared.refusing.load(SeqCst) {
            continue; // Dropping `client` closes it.
        }
        let Ok(upstream) = TcpStream::connect_timeout(&shared.upstream, Duration::from_secs(1))
        else {
            continue; // Upstream down: close the client too.
        };
        // Accepted sockets may inherit the listener's non-blocking mode.
        let setup = client.set_nonblocking(false).and(client.set_nodelay(true));
        if setup.and(upstream.set_nodelay(true)).is_err() {
            continue;
        }
        let connection = Arc::new(Connection {
            client,
            upstream,
            last_activity: AtomicU64::new(shared.now()),
            closed: AtomicBool::new(false),
            pumps_left: AtomicUsize::new(2),
        });
        shared.connections().insert(id, connection.clone());
        for to_upstream in [true, false] {
            let (shared, connection) = (shared.clone(), connection.clone());
            pumps.push(thread::spawn(move || {
                let (from, to) = if to_upstream {
                    (&connection.client, &connection.upstream)
                } else {
                    (&connection.upstream, &connection.client)
                };
                if forward(&shared, &connection, from, to) {
                    // The source ended cleanly: pass the half close on.
                    let _ = to.shutdown(Shutdown::Write);
                } else {
                    connection.close();
                }
                if connection.pumps_left.fetch_sub(1, SeqCst) == 1 {
                    connection.close();
                    shared.connections().remove(&id);
                }
            }));
        }
    }
    // A connection accepted while the proxy was being dropped may have
    // escaped `Drop`'s `close_all`.
    shared.close_all();
    for pump in pumps {
        let _ = pump.join();
    }
}

/// Copies `from` to `to` chunk by chunk, applying latency and stalls.
/// Returns true when `from` reached end of stream, false when the connection
/// must be closed (error, idle timeout, `drop_all`, proxy dropped).
fn forward(
    shared: &Shared,
    connection: &Connection,
    mut from: &TcpStream,
    mut to: &TcpStream,
) -> bool {
    let mut buffer = [0u8; 16 * 1024];
    loop {
        if !shared.alive(connection) {
            return false;
        }
        // While stalled, leave the bytes in the kernel's buffers.
        if shared.stalled.load(SeqCst) {
            thread::sleep(TICK);
            continue;
        }
        if !readable(from, TICK) {
            continue;
        }
        let read = match from.read(&mut buffer) {
            Ok(0) => return true,
            Ok(read) => read,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => return false,
        };
        connection.touch(shared);
        let latency = Duration::from_nanos(shared.latency_nanos.load(SeqCst));
        if !shared.hold(connection, Instant::now() + latency) {
            return false;
        }
        if to.write_all(&buffer[..read]).is_err() {
            return false;
        }
        connection.touch(shared);
    }
}

/// Waits up to `timeout` for `socket` to be readable (or at end of stream,
/// or in error). Sleeps for `timeout` if `poll` fails, so callers that loop
/// on it never spin.
fn readable(socket: &impl AsRawFd, timeout: Duration) -> bool {
    let mut poll = libc::pollfd {
        fd: socket.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let millis = timeout.as_millis().clamp(1, i32::MAX as u128) as libc::c_int;
    // SAFETY: one valid pollfd, for the duration of the call.
    match unsafe { libc::poll(&mut poll, 1, millis) } {
        -1 => {
            thread::sleep(timeout);
            false
        }
        ready => ready > 0,
    }
}

fn nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{command, read_reply, RedisServer};

    const PING: &[u8] = b"*1\r\n$4\r\nPING\r\n";

    /// Polls `condition` every few ms for up to 30 s (a bound for a hang,
    /// not a timing).
    fn wait_until(what: &str, mut condition: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !condition() {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            thread::sleep(Duration::from_millis(5));
        }
    }

    fn connect(proxy: &Proxy) -> TcpStream {
        let stream = TcpStream::connect((Ipv4Addr::LOCALHOST, proxy.port())).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(2)))
            .unwrap();
        stream
    }

    fn ping(stream: &mut TcpStream) -> io::Result<String> {
        stream.write_all(PING)?;
        read_reply(stream)
    }

    /// The peer closed: the next read is end of stream or a reset, not a
    /// timeout.
    fn assert_closed(stream: &mut TcpStream) {
        stream
            .set_read_timeout(Some(Duration::from_secs(2)))
            .unwrap();
        match stream.read(&mut [0u8; 64]) {
            Ok(0) => {}
            Ok(read) => panic!("read {read} bytes from a connection that should be closed"),
            Err(error) => assert!(
                !matches!(
                    error.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ),
                "connection still open: {error}"
            ),
        }
    }

    #[test]
    fn forwards_both_ways_and_counts() {
        let server = RedisServer::start();
        let proxy = Proxy::start(server.port());
        assert_eq!(proxy.url(), format!("redis://127.0.0.1:{}/", proxy.port()));
        assert_eq!(
            command(proxy.port(), &["SET", "k", "v"]).unwrap(),
            "+OK\r\n"
        );
        assert_eq!(command(proxy.port(), &["GET", "k"]).unwrap(), "$1\r\nv\r\n");
        assert_eq!(proxy.accepted(), 2);
        wait_until("connections to close", || proxy.connections() == 0);
    }

    #[test]
    fn drop_all_closes_open_connections() {
        let server = RedisServer::start();
        let proxy = Proxy::start(server.port());
        let mut streams = [connect(&proxy), connect(&proxy)];
        for stream in &mut streams {
            assert_eq!(ping(stream).unwrap(), "+PONG\r\n");
        }
        assert_eq!(proxy.connections(), 2);
        proxy.drop_all();
        for stream in &mut streams {
            assert_closed(stream);
        }
        wait_until("connections to close", || proxy.connections() == 0);
        assert_eq!(command(proxy.port(), &["PING"]).unwrap(), "+PONG\r\n");
        assert_eq!(proxy.accepted(), 3);
    }

    #[test]
    fn idle_timeout_closes_idle_connections_only() {
        let server = RedisServer::start();
        let proxy = Proxy::start(server.port());
        // 1 s: the busy connection's pings below are never that far apart,
        // even on a loaded machine.
        const IDLE: Duration = Duration::from_secs(1);
        proxy.set_idle_timeout(Some(IDLE));
        let (mut idle, mut busy) = (connect(&proxy), connect(&proxy));
        // Before the idle connection's last bytes: it is closed at least
        // IDLE after this.
        let start = Instant::now();
        assert_eq!(ping(&mut idle).unwrap(), "+PONG\r\n");
        // Keep `busy` busy until the proxy has closed `idle`.
        wait_until("the idle connection to close", || {
            assert_eq!(ping(&mut busy).unwrap(), "+PONG\r\n");
            proxy.connections() == 1
        });
        assert!(
            start.elapsed() >= IDLE,
            "closed after {:?}",
            start.elapsed()
        );
        assert_closed(&mut idle);
        assert_eq!(ping(&mut busy).unwrap(), "+PONG\r\n");
        proxy.set_idle_timeout(None);
    }

    #[test]
    fn latency_delays_both_directions() {
        let server = RedisServer::start();
        let proxy = Proxy::start(server.port());
        let mut stream = connect(&proxy);
        assert_eq!(ping(&mut stream).unwrap(), "+PONG\r\n");
        proxy.set_latency(Duration::from_millis(100));
        let start = Instant::now();
        assert_eq!(ping(&mut stream).unwrap(), "+PONG\r\n");
        assert!(
            start.elapsed() >= Duration::from_millis(200),
            "{:?}",
            start.elapsed()
        );
    }

    #[test]
    fn stall_holds_bytes_until_resume() {
        let server = RedisServer::start();
        let proxy = Proxy::start(server.port());
        let mut old = connect(&proxy);
        assert_eq!(ping(&mut old).unwrap(), "+PONG\r\n");
        proxy.stall();
        let mut new = connect(&proxy);
        for stream in [&mut old, &mut new] {
            stream.write_all(PING).unwrap();
            // Nothing comes back while stalled (a proxy that forwarded the
            // PING would answer within this).
            stream
                .set_read_timeout(Some(Duration::from_millis(500)))
                .unwrap();
            let error = stream.read(&mut [0u8; 64]).unwrap_err();
            assert!(matches!(
                error.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
            ));
        }
        wait_until("the new connection to register", || {
            proxy.connections() == 2
        });
        proxy.resume();
        for stream in [&mut old, &mut new] {
            stream
                .set_read_timeout(Some(Duration::from_secs(2)))
                .unwrap();
            assert_eq!(read_reply(stream).unwrap(), "+PONG\r\n");
        }
    }

    #[test]
    fn refuse_closes_new_connections_only() {
        let server = RedisServer::start();
        let proxy = Proxy::start(server.port());
        let mut old = connect(&proxy);
        assert_eq!(ping(&mut old).unwrap(), "+PONG\r\n");
        proxy.refuse(true);
        let mut refused = connect(&proxy);
        assert_closed(&mut refused);
        assert!(command(proxy.port(), &["PING"]).is_err());
        assert_eq!(ping(&mut old).unwrap(), "+PONG\r\n");
        assert_eq!((proxy.accepted(), proxy.connections()), (3, 1));
        proxy.refuse(false);
        assert_eq!(command(proxy.port(), &["PING"]).unwrap(), "+PONG\r\n");
    }

    #[test]
    fn dropping_the_proxy_closes_everything() {
        let server = RedisServer::start();
        let proxy = Proxy::start(server.port());
        let mut stream = connect(&proxy);
        assert_eq!(ping(&mut stream).unwrap(), "+PONG\r\n");
        proxy.stall(); // Pumps asleep must still notice the drop.
                       // Dropped on a helper thread: a drop that hangs fails the test
                       // instead of hanging it.
        let (dropped, done) = std::sync::mpsc::channel();
        thread::spawn(move || {
            drop(proxy);
            let _ = dropped.send(());
        });
        done.recv_timeout(Duration::from_secs(10))
            .expect("dropping the proxy returned");
        assert_closed(&mut stream);
    }
}
