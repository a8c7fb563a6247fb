//! The transport seam carries everything (issue 37, docs/design.md §10):
//! a client whose `Config::network` forwards every command and every
//! pub/sub message to real redis-server processes over real TCP works as
//! over TCP itself: a waiter woken by a release's message, renewal,
//! fencing, a quorum of 3, a Redis Cluster of 3 primaries (sharded
//! messages), Sentinel following a `SENTINEL FAILOVER`. And nothing goes
//! around the seam: every connection the servers see from the client is
//! one the network opened (named `seam`).

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lock_runtime::simulation::{BoxFuture, Conn, Network, Push};
use lock_runtime::{Client, Config, Lock, LockGuard};
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, PushKind, RedisResult, Value};
use test_support::cluster::RedisCluster;
use test_support::sentinel::RedisSentinel;
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender};

use common::{redis, spawn_waiter, value, wait_until_async, waited, RedisServer, LINE_TIMEOUT};

/// A network whose every connection is a real one to the node at its
/// address: commands on a RESP2 connection (the replies' shapes the
/// client reads over TCP), subscriptions on a RESP3 connection whose pushes
/// are the connection's pushes. Both are named `seam`.
#[derive(Default)]
struct Forward {
    log: Arc<Mutex<Log>>,
}

/// What went through the network.
#[derive(Default)]
struct Log {
    /// Connections opened, by address.
    connections: BTreeMap<String, usize>,
    /// Pushes delivered: the node's address, their kind, their channel.
    pushes: Vec<(String, PushKind, String)>,
}

impl Forward {
    fn log(&self) -> std::sync::MutexGuard<'_, Log> {
        self.log.lock().unwrap()
    }

    /// Pushes of `kind` on channels starting with `prefix`.
    fn pushed(&self, kind: PushKind, prefix: &str) -> usize {
        self.log()
            .pushes
            .iter()
            .filter(|(_, k, channel)| *k == kind && channel.starts_with(prefix))
            .count()
    }
}

impl Network for Forward {
    fn connect(&self, address: &str) -> BoxFuture<'static, RedisResult<Arc<dyn Conn>>> {
        let (address, log) = (address.to_owned(), Arc::clone(&self.log));
        Box::pin(async move {
            let commands = named(&format!("redis://{address}/"), None).await?;
            *log.lock()
                .unwrap()
                .connections
                .entry(address.clone())
                .or_default() += 1;
            let (sender, pushes) = tokio::sync::mpsc::unbounded_channel();
            Ok(Arc::new(Forwarded {
                address,
                commands,
                subscriptions: Arc::new(tokio::sync::OnceCell::new()),
                sender,
                pushes: Arc::new(tokio::sync::Mutex::new(pushes)),
                log,
            }) as Arc<dyn Conn>)
        })
    }
}

/// A connection to `url` named `seam` (its pushes to `pushes`, on RESP3).
async fn named(
    url: &str,
    pushes: Option<UnboundedSender<Push>>,
) -> RedisResult<MultiplexedConnection> {
    let client = redis::Client::open(url)?;
    let config = AsyncConnectionConfig::new().set_connection_timeout(Some(Duration::from_secs(5)));
    let config = match pushes {
        Some(pushes) => config.set_push_sender(pushes),
        None => config,
    };
    let mut connection = client
        .get_multiplexed_async_connection_with_config(&config)
        .await?;
    redis::cmd("CLIENT")
        .arg("SETNAME")
        .arg("seam")
        .exec_async(&mut connection)
        .await?;
    Ok(connection)
}

struct Forwarded {
    address: String,
    commands: MultiplexedConnection,
    /// Opened by the first subscription.
    subscriptions: Arc<tokio::sync::OnceCell<MultiplexedConnection>>,
    sender: UnboundedSender<Push>,
    pushes: Arc<tokio::sync::Mutex<UnboundedReceiver<Push>>>,
    log: Arc<Mutex<Log>>,
}

impl Conn for Forwarded {
    fn send(&self, commands: Vec<Vec<Vec<u8>>>) -> BoxFuture<'static, RedisResult<Vec<Value>>> {
        let subscribes = commands.iter().any(|command| {
            let name = String::from_utf8_lossy(&command[0]).to_ascii_uppercase();
            name.ends_with("SUBSCRIBE")
        });
        let mut pipeline = redis::pipe();
        for command in &commands {
            let mut cmd = redis::cmd(&String::from_utf8_lossy(&command[0]));
            for arg in &command[1..] {
                cmd.arg(arg.as_slice());
            }
            pipeline.add_command(cmd);
        }
        let count = commands.len();
        let plain = self.commands.clone();
        let subscriptions = Arc::clone(&self.subscriptions);
        let (url, sender) = (
            format!("redis://{}/?protocol=resp3", self.address),
            self.sender.clone(),
        );
        Box::pin(async move {
            let mut connection = if subscribes {
                subscriptions
                    .get_or_try_init(|| named(&url, Some(sender)))
                    .await?
                    .clone()
            } else {
                plain
            };
            connection.send_packed_commands(&pipeline, 0, count).await
        })
    }

    fn next_push(&self) -> BoxFuture<'static, Option<Push>> {
        let (pushes, log, address) = (
            Arc::clone(&self.pushes),
            Arc::clone(&self.log),
            self.address.clone(),
        );
        Box::pin(async move {
            let push = pushes.lock().await.recv().await?;
            if push.kind == PushKind::Disconnection {
                return None;
            }
            let channel = match push.data.first() {
                Some(Value::BulkString(channel)) => String::from_utf8_lossy(channel).into_owned(),
                _ => String::new(),
            };
            log.lock()
                .unwrap()
                .pushes
                .push((address, push.kind.clone(), channel));
            Some(push)
        })
    }
}

/// A client of `config` on the forwarding network.
fn client(config: Config, network: &Arc<Forward>) -> Client {
    Client::new(
        config
            .network(Arc::clone(network) as Arc<dyn Network>)
            .instance("seam-test"),
    )
    .unwrap()
}

/// Every client connection of the nodes at `ports` came through the seam
/// (`seam`) but replication links, the sentinels' own connections and the
/// one that asks; and each node has at least one of the seam's.
fn only_the_seam_connects(ports: &[u16]) {
    for &port in ports {
        let list = test_support::command(port, &["CLIENT", "LIST"]).unwrap();
        let mut seam = 0;
        for line in list.lines().filter(|line| line.starts_with("id=")) {
            let field = |name: &str| {
                line.split(' ')
                    .find_map(|pair| pair.strip_prefix(name)?.strip_prefix('='))
                    .unwrap_or_default()
            };
            let name = field("name");
            let replication = field("flags").contains(['S', 'M']);
            let asking = field("cmd") == "client|list";
            seam += usize::from(name == "seam");
            assert!(
                name == "seam" || name.starts_with("sentinel-") || replication || asking,
                "a connection to {port} that did not come through the network: {line}"
            );
        }
        assert!(seam > 0, "no connection of the seam on {port}:\n{list}");
    }
}

/// A waiter woken by a release's message, a renewed lock kept past its
/// ttl, and fencing tokens that increase: on one server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_server_over_the_seam() {
    let server = RedisServer::start();
    let network = Arc::new(Forward::default());
    let holder = client(Config::new(server.url()), &network);
    let other = client(Config::new(server.url()), &network);

    woken_by_message(
        &network,
        (&holder, &other),
        "job",
        (PushKind::Subscribe, PushKind::Message),
        || redis(&server, &["LRANGE", "lock:{job}:queue", "0", "-1"]),
    )
    .await;
    renewed_and_fenced(&holder, |key| value(&redis(&server, &["PTTL", key]))).await;
    only_the_seam_connects(&[server.port()]);
}

/// A lock of 600 ms renewed for three times its ttl, and two fenced
/// acquisitions in a row with increasing tokens. `pttl`: the key's PTTL.
async fn renewed_and_fenced(client: &Client, pttl: impl Fn(&str) -> Option<String>) {
    let renewed = Lock::new("renewed")
        .ttl(Duration::from_millis(600))
        .renew()
        .client(client.clone())
        .try_acquire()
        .await
        .unwrap();
    let taken = Instant::now();
    let before = client.renewal_stats().batches;
    wait_until_async("three renewals", LINE_TIMEOUT, || {
        client.renewal_stats().batches >= before + 3
            && taken.elapsed() > Duration::from_millis(1800)
    })
    .await;
    assert!(renewed.is_held(), "lost: {:?}", renewed.lost_cause());
    let left: i64 = pttl("lock:{renewed}").unwrap().parse().unwrap();
    assert!(left > 0, "the key lives on: {left} ms");
    renewed.release().await.unwrap();

    let mut last = 0;
    for _ in 0..2 {
        let fenced: LockGuard = Lock::new("fenced")
            .fencing()
            .client(client.clone())
            .try_acquire()
            .await
            .unwrap();
        let token = fenced.fencing_token().expect("a fencing token");
        assert!(token > last, "{token} after {last}");
        last = token;
        fenced.release().await.unwrap();
    }
}

/// A waiter of another client woken by the release of `name` (held by
/// `holder`): once it is in line (`line`: the RESP reply listing the
/// lock's line, `<channel>|<token>` entries) and its channel's subscription
/// was confirmed through the network (`kind`), the release's message
/// (`message`) reaches it through the network.
async fn woken_by_message(
    network: &Forward,
    (holder, other): (&Client, &Client),
    name: &str,
    (kind, message): (PushKind, PushKind),
    mut line: impl FnMut() -> String,
) {
    let guard = Lock::new(name)
        .ttl(Duration::from_secs(30))
        .client(holder.clone())
        .try_acquire()
        .await
        .unwrap();
    let waiter = spawn_waiter(other, name, Duration::from_secs(20));
    let mut channel = String::new();
    wait_until_async("the waiter is in line", LINE_TIMEOUT, || {
        let reply = line();
        let entry = reply
            .split("\r\n")
            .find(|line| line.starts_with("lock-waiters:"));
        if let Some((queued, _token)) = entry.and_then(|entry| entry.rsplit_once('|')) {
            channel = queued.to_owned();
        }
        !channel.is_empty()
    })
    .await;
    wait_until_async("its channel is listened to", LINE_TIMEOUT, || {
        network.pushed(kind.clone(), &channel) > 0
    })
    .await;
    let before = network.pushed(message.clone(), &channel);
    guard.release().await.unwrap();
    waited(waiter).await.release().await.unwrap();
    // (Its message wakes it; a refresh of its place in line that came
    // first would take the lock before the message is read.)
    wait_until_async("the release's message comes through", LINE_TIMEOUT, || {
        network.pushed(message.clone(), &channel) > before
    })
    .await;
}

/// A quorum of 3 independent servers: a fenced lock, a woken waiter,
/// renewal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quorum_of_three_over_the_seam() {
    let nodes = [
        RedisServer::start(),
        RedisServer::start(),
        RedisServer::start(),
    ];
    let urls: Vec<String> = nodes.iter().map(RedisServer::url).collect();
    let network = Arc::new(Forward::default());
    let (holder, other) = (
        client(Config::quorum(urls.clone()), &network),
        client(Config::quorum(urls), &network),
    );
    // The waiter's place in line, on the first node (`:waiters`).
    let line = || {
        redis(
            &nodes[0],
            &["ZRANGE", "lock:{quorum-job}:waiters", "0", "-1"],
        )
    };
    woken_by_message(
        &network,
        (&holder, &other),
        "quorum-job",
        (PushKind::Subscribe, PushKind::Message),
        line,
    )
    .await;
    // The key of every node that took it lives on.
    renewed_and_fenced(&holder, |key| {
        nodes
            .iter()
            .map(|node| value(&redis(node, &["PTTL", key])).unwrap())
            .max_by_key(|pttl| pttl.parse::<i64>().unwrap())
    })
    .await;
    let ports: Vec<u16> = nodes.iter().map(RedisServer::port).collect();
    only_the_seam_connects(&ports);
    assert_eq!(
        network.log().connections.len(),
        3,
        "every node, by its address"
    );
}

/// `CLUSTER KEYSLOT key`, asked of the node on `port`.
fn keyslot(port: u16, key: &str) -> u16 {
    let reply = test_support::command(port, &["CLUSTER", "KEYSLOT", key]).unwrap();
    value(&reply).unwrap().parse().unwrap()
}

/// A Redis Cluster of 3 primaries: locks on every primary, each waiter
/// woken by a sharded message (`smessage`) of its slot's primary, renewal
/// and fencing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_of_three_primaries_over_the_seam() {
    let cluster = RedisCluster::start(3, 0);
    let network = Arc::new(Forward::default());
    let (holder, other) = (
        client(Config::cluster(cluster.urls()), &network),
        client(Config::cluster(cluster.urls()), &network),
    );
    let any = cluster.ports()[0];
    let mut woken_on = std::collections::BTreeSet::new();
    for i in 0..12 {
        let name = format!("spread:{i}");
        let port = cluster
            .primary_of_slot(keyslot(any, &format!("lock:{{{name}}}")))
            .unwrap();
        let queue = format!("lock:{{{name}}}:queue");
        woken_by_message(
            &network,
            (&holder, &other),
            &name,
            (PushKind::SSubscribe, PushKind::SMessage),
            || test_support::command(port, &["LRANGE", &queue, "0", "-1"]).unwrap(),
        )
        .await;
        woken_on.insert(port);
    }
    assert_eq!(woken_on.len(), 3, "the names cover every primary");
    renewed_and_fenced(&holder, |key| {
        let port = cluster.primary_of_slot(keyslot(any, key)).unwrap();
        value(&test_support::command(port, &["PTTL", key]).unwrap())
    })
    .await;
    only_the_seam_connects(cluster.ports());
}

/// Redis Sentinel: the client finds the primary through the sentinels,
/// hears `+switch-master` through the network after `SENTINEL FAILOVER`,
/// moves there (a new lock taken on the new primary) and keeps renewing
/// its lock there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_following_a_failover_over_the_seam() {
    let setup = RedisSentinel::start();
    let network = Arc::new(Forward::default());
    let client_ = client(Config::new(setup.url("")), &network);
    let other = client(Config::new(setup.url("")), &network);
    let client = client_;
    let primary = setup.primary().unwrap();
    let kept = Lock::new("kept")
        .ttl(Duration::from_secs(6))
        .renew()
        .client(client.clone())
        .try_acquire()
        .await
        .unwrap();
    woken_by_message(
        &network,
        (&client, &other),
        "sentinel-job",
        (PushKind::Subscribe, PushKind::Message),
        || {
            let queue = "lock:{sentinel-job}:queue";
            test_support::command(primary, &["LRANGE", queue, "0", "-1"]).unwrap()
        },
    )
    .await;
    // The watcher listens on every sentinel before the failover.
    wait_until_async("every sentinel is listened to", LINE_TIMEOUT, || {
        network.pushed(PushKind::Subscribe, "+switch-master") >= setup.sentinel_ports().len()
    })
    .await;
    setup.wait_until_replicated().unwrap();
    setup.failover().unwrap();
    let new = setup.wait_for_new_primary(primary, 0).unwrap();
    let switched = Instant::now();
    wait_until_async(
        "a sentinel's +switch-master came through",
        LINE_TIMEOUT,
        || network.pushed(PushKind::Message, "+switch-master") > 0,
    )
    .await;
    let after = Lock::new("after")
        .wait(Duration::from_secs(30))
        .client(client.clone())
        .acquire()
        .await
        .unwrap();
    let on_new = test_support::command(new, &["GET", "lock:{after}"]).unwrap();
    assert!(value(&on_new).is_some(), "taken on the new primary");
    after.release().await.unwrap();
    wait_until_async(
        "the kept lock is renewed on the new primary",
        LINE_TIMEOUT,
        || {
            assert!(kept.is_held(), "lost: {:?}", kept.lost_cause());
            let ttl = kept.ttl();
            Instant::now() + kept.remaining()
                >= switched + ttl - (ttl / 100 + Duration::from_millis(2))
        },
    )
    .await;
    kept.release().await.unwrap();
    let mut ports = vec![new];
    ports.extend_from_slice(setup.sentinel_ports());
    only_the_seam_connects(&ports);
}
