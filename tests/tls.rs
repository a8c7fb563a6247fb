//! TLS (`rediss://`, the `tls-rustls` feature) against real redis-servers
//! that serve TLS only (`--port 0`, `--tls-port`), with certificates made
//! for each test (test-support's `Ca`): a private CA trusted through
//! `Config::tls_root_certificates`; servers whose certificate must be
//! rejected (an unknown CA, another host's name), promptly and with an
//! error that says what to do; mutual TLS; a cluster and a quorum over TLS.

mod common;
use common::*;
use std::time::{Duration, Instant};

use lock_runtime::{Client, Config, Lock, LockError};
use test_support::{AuthClients, Ca, RedisCluster, TlsOptions};

/// A rejected handshake is not retried: it fails within this, far below
/// the 10 s deadline of a call (connect 5 s + response 5 s) and the 20 s
/// wait of the waiting acquire below, which a retried one would reach.
const PROMPT: Duration = Duration::from_secs(4);

/// A client of `url` trusting `ca`.
fn trusting(url: String, ca: &Ca) -> Client {
    Client::new(Config::new(url).tls_root_certificates(ca.certificate_pem())).unwrap()
}

/// The channel of the one waiter queued in `queue` on `server` (its entry
/// is `<channel>|<token>`): where a release tells it.
fn queued_channel(server: &RedisServer, queue: &str) -> String {
    let reply = redis(server, &["LRANGE", queue, "0", "-1"]);
    let entries: Vec<&str> = reply
        .split("\r\n")
        .filter(|line| !line.is_empty() && !line.starts_with(['*', '$']))
        .collect();
    assert_eq!(entries.len(), 1, "one waiter in {queue}: {reply:?}");
    let (channel, _token) = entries[0].rsplit_once('|').expect("<channel>|<token>");
    channel.to_owned()
}

/// Subscribers of `channel` on `server` (`PUBSUB NUMSUB` or, with
/// `sharded`, `PUBSUB SHARDNUMSUB`).
fn numsub(server: &RedisServer, sharded: bool, channel: &str) -> u64 {
    let which = if sharded { "SHARDNUMSUB" } else { "NUMSUB" };
    let reply = redis(server, &["PUBSUB", which, channel]);
    let count = reply.rsplit(':').next().unwrap_or_default();
    count.trim().parse().unwrap_or_else(|_| panic!("{reply:?}"))
}

/// Waits (bounded) until the one waiter queued for the lock `name` on
/// `server` is listened for on its channel there, over TLS (the server has
/// no other port): the release's message reaches its client.
async fn wait_until_listened_for(server: &RedisServer, sharded: bool, name: &str) {
    let queue = format!("lock:{{{name}}}:queue");
    wait_until_async("the waiter queues", LINE_TIMEOUT, || {
        redis(server, &["LLEN", &queue]) == ":1\r\n"
    })
    .await;
    let channel = queued_channel(server, &queue);
    wait_until_async("the waiter's client listens", LINE_TIMEOUT, || {
        numsub(server, sharded, &channel) == 1
    })
    .await;
}

/// `rediss://` with the private CA trusted: a lock is acquired and
/// released, and a waiter of another client is woken by the release's
/// message (its pub/sub connection is a TLS connection too: the server
/// has no other port), long before the holder's ttl.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_and_a_woken_waiter_over_tls() {
    let ca = Ca::new("lock-tests CA");
    let server = RedisServer::start_tls(&TlsOptions::loopback(&ca));
    assert!(server.url().starts_with("rediss://127.0.0.1:"));
    let (one, other) = (trusting(server.url(), &ca), trusting(server.url(), &ca));
    let guard = Lock::new("tls")
        .ttl(Duration::from_secs(30))
        .client(one.clone())
        .try_acquire()
        .await
        .unwrap();
    assert_eq!(
        value(&redis(&server, &["EXISTS", "lock:{tls}"])).as_deref(),
        Some("1")
    );
    let waiter = spawn_waiter(&other, "tls", Duration::from_secs(20));
    wait_until_listened_for(&server, false, "tls").await;
    let released = Instant::now();
    guard.release().await.unwrap();
    let guard = waited(waiter).await;
    assert!(
        released.elapsed() < Duration::from_secs(10),
        "the waiter took {:?} (the holder's ttl is 30 s)",
        released.elapsed()
    );
    guard.release().await.unwrap();
    assert_eq!(redis(&server, &["EXISTS", "lock:{tls}"]), ":0\r\n");
}

/// The error of an acquire that cannot get through the handshake: a Redis
/// error (not Busy, not a timeout blamed on a holder), promptly, also for
/// a waiting acquire (a rejected certificate is not retried).
async fn rejected(config: Config) -> Vec<String> {
    let config = config
        .connect_timeout(Duration::from_secs(5))
        .response_timeout(Duration::from_secs(5));
    let client = Client::new(config).unwrap();
    let mut messages = Vec::new();
    for lock in [
        Lock::new("rejected").client(client.clone()),
        Lock::new("rejected")
            .wait(Duration::from_secs(20))
            .client(client.clone()),
    ] {
        let started = Instant::now();
        let error = lock.acquire().await.expect_err("the handshake must fail");
        assert!(matches!(error, LockError::Redis { .. }), "{error:?}");
        assert!(
            started.elapsed() < PROMPT,
            "took {:?}: {error}",
            started.elapsed()
        );
        messages.push(error.to_string());
    }
    messages
}

/// A server whose certificate a CA the client does not trust signed is
/// rejected: with the private CA of another deployment trusted, and with
/// the default (public webpki) roots alike.
#[tokio::test]
async fn a_server_signed_by_an_unknown_ca_is_rejected() {
    let (trusted, unknown) = (Ca::new("lock-tests CA"), Ca::new("somebody else's CA"));
    let server = RedisServer::start_tls(&TlsOptions::loopback(&unknown));
    for config in [
        Config::new(server.url()).tls_root_certificates(trusted.certificate_pem()),
        Config::new(server.url()),
    ] {
        for message in rejected(config).await {
            assert!(
                message.contains("certificate")
                    && message.contains("not signed by a CA this client trusts")
                    && message.contains("Config::tls_root_certificates"),
                "{message}"
            );
        }
    }
    // The same server, its CA trusted: fine.
    let client = trusting(server.url(), &unknown);
    Lock::new("rejected")
        .client(client)
        .try_acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
}

/// A certificate signed by the trusted CA, but for another host, is
/// rejected: the URL's address is not among its names.
#[tokio::test]
async fn a_certificate_for_another_host_is_rejected() {
    let ca = Ca::new("lock-tests CA");
    let server = RedisServer::start_tls(&TlsOptions::new(&ca, &["redis.example.com"]));
    let config = Config::new(server.url()).tls_root_certificates(ca.certificate_pem());
    for message in rejected(config).await {
        assert!(
            message.contains("not for the host name or address in the URL"),
            "{message}"
        );
    }
}

/// Mutual TLS: a server that requires a client certificate signed by its
/// client CA refuses a client that shows none, or one of another CA,
/// promptly and saying what to give; it serves one that shows a
/// certificate of its CA (`Config::tls_client_certificate`), on its lock
/// connection and on its pub/sub connection alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls() {
    let (ca, clients) = (Ca::new("lock-tests CA"), Ca::new("lock-tests clients CA"));
    let server = RedisServer::start_tls(
        &TlsOptions::loopback(&ca)
            .client_ca(&clients)
            .auth_clients(AuthClients::Yes),
    );
    let config = || Config::new(server.url()).tls_root_certificates(ca.certificate_pem());
    let stranger = ca.client_certificate("not a client of this server");
    for config in [
        config(),
        config().tls_client_certificate(stranger.certificate_pem, stranger.key_pem),
    ] {
        for message in rejected(config).await {
            assert!(
                message.contains("client certificate")
                    && message.contains("Config::tls_client_certificate"),
                "{message}"
            );
        }
    }
    let me = clients.client_certificate("app");
    let config = config().tls_client_certificate(me.certificate_pem.clone(), me.key_pem.clone());
    let key_line = me.key_pem.lines().nth(1).expect("a PEM body");
    assert!(!format!("{config:?}").contains(key_line), "{config:?}");
    let (one, other) = (
        Client::new(config.clone()).unwrap(),
        Client::new(config).unwrap(),
    );
    let guard = Lock::new("mutual")
        .ttl(Duration::from_secs(30))
        .client(one)
        .try_acquire()
        .await
        .unwrap();
    let waiter = spawn_waiter(&other, "mutual", Duration::from_secs(20));
    wait_until_listened_for(&server, false, "mutual").await;
    guard.release().await.unwrap();
    waited(waiter).await.release().await.unwrap();
}

/// Certificates that cannot work are `Config` errors when the client is
/// built (and by `init_with`), not failed calls later; none of them quotes
/// the private key.
#[tokio::test]
async fn certificate_mistakes_are_config_errors() {
    let ca = Ca::new("lock-tests CA");
    let (me, other) = (ca.client_certificate("app"), ca.client_certificate("other"));
    let url = "rediss://127.0.0.1:1/";
    let cases = [
        (
            Config::new(url).tls_root_certificates("not a certificate"),
            "holds no certificate",
        ),
        (
            Config::new(url)
                .tls_client_certificate(me.certificate_pem.clone(), other.key_pem.clone()),
            "does not belong to the certificate",
        ),
        (
            Config::new(url).tls_client_certificate(me.certificate_pem.clone(), "-----BEGIN"),
            "not a PEM private key",
        ),
        (
            Config::new("redis://127.0.0.1:1/").tls_root_certificates(ca.certificate_pem()),
            "does not use TLS",
        ),
        (
            Config::new("redis-cluster://127.0.0.1:1,127.0.0.1:2")
                .tls_root_certificates(ca.certificate_pem()),
            "does not use TLS",
        ),
        (Config::new("rediss://127.0.0.1:1/#insecure"), "#insecure"),
    ];
    let secrets: Vec<&str> = [&me.key_pem, &other.key_pem]
        .iter()
        .flat_map(|pem| pem.lines().filter(|line| !line.starts_with("-----")))
        .collect();
    for (config, expected) in cases {
        for error in [
            Client::new(config.clone()).expect_err("a mistake"),
            lock_runtime::init_with(config).expect_err("a mistake"),
        ] {
            let message = error.to_string();
            assert!(matches!(error, LockError::Config { .. }), "{error:?}");
            assert!(message.contains(expected), "{message}");
            for secret in &secrets {
                assert!(
                    !format!("{message} {error:?}").contains(secret),
                    "{message}"
                );
            }
        }
    }
}

/// A Redis Cluster over TLS (`tls-cluster yes`: the nodes announce their
/// TLS ports): the client trusts the private CA for the seed and for every
/// primary it discovers, and for the sharded pub/sub that wakes waiters.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_over_tls() {
    let ca = Ca::new("lock-tests CA");
    let cluster = RedisCluster::start_tls(3, 0, &TlsOptions::loopback(&ca));
    // One seed: the other primaries are learnt from CLUSTER SLOTS.
    let config =
        || Config::cluster([cluster.urls()[0].clone()]).tls_root_certificates(ca.certificate_pem());
    let (one, other) = (
        Client::new(config()).unwrap(),
        Client::new(config()).unwrap(),
    );
    let mut used = std::collections::BTreeSet::new();
    for index in 0..12 {
        let name = format!("tls-cluster-{index}");
        let slot: u16 = value(
            &cluster
                .command(
                    cluster.ports()[0],
                    &["CLUSTER", "KEYSLOT", &format!("lock:{{{name}}}")],
                )
                .unwrap(),
        )
        .unwrap()
        .parse()
        .unwrap();
        let port = cluster.primary_of_slot(slot).unwrap();
        let guard = Lock::new(name.as_str())
            .ttl(Duration::from_secs(30))
            .client(one.clone())
            .try_acquire()
            .await
            .unwrap();
        if used.insert(port) {
            // A waiter, woken by a message on the slot's primary.
            let waiter = spawn_waiter(&other, &name, Duration::from_secs(20));
            wait_until_listened_for(cluster.node(port).unwrap(), true, &name).await;
            guard.release().await.unwrap();
            waited(waiter).await.release().await.unwrap();
        } else {
            guard.release().await.unwrap();
        }
    }
    assert_eq!(used.len(), 3, "the names cover every primary");
}

/// A quorum (RedLock) of three TLS servers: the certificates apply to
/// every node.
#[tokio::test]
async fn a_quorum_over_tls() {
    let ca = Ca::new("lock-tests CA");
    let nodes: Vec<RedisServer> = (0..3)
        .map(|_| RedisServer::start_tls(&TlsOptions::loopback(&ca)))
        .collect();
    let hosts: Vec<String> = nodes
        .iter()
        .map(|node| format!("127.0.0.1:{}", node.port()))
        .collect();
    let client = Client::new(
        Config::new(format!("rediss-quorum://{}", hosts.join(",")))
            .tls_root_certificates(ca.certificate_pem()),
    )
    .unwrap();
    open_connections(&client, &nodes).await;
    let guard = Lock::new("tls-quorum")
        .fencing()
        .client(client)
        .try_acquire()
        .await
        .unwrap();
    // Held on a majority; the third node's call, sent on its open
    // connection, lands too (it may come after the acquisition returned).
    for node in &nodes {
        wait_until_async("every node holds the lock", LINE_TIMEOUT, || {
            redis(node, &["EXISTS", "lock:{tls-quorum}"]) == ":1\r\n"
        })
        .await;
    }
    guard.release().await.unwrap();
}
