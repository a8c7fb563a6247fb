//! The calls users of other lock libraries reach for, on real servers:
//! extending a held lock by hand (`LockGuard::extend`, own lock only, never
//! re-creating an expired key), asking who holds a lock and until when
//! (`Lock::holder`, with no more ACL than taking the lock needs) on every
//! backend (one server, Redis Cluster, Sentinel, a quorum), and a `Config`
//! built from the `redis` crate's `ConnectionInfo`.

mod common;
use common::*;

use std::time::Duration;

use lock_runtime::{Client, Config, Lock, LockError, LostCause};
use test_support::{RedisCluster, RedisSentinel};

fn client(url: impl Into<String>) -> Client {
    Client::new(Config::new(url)).unwrap()
}

/// The key's PTTL in ms.
fn pttl(server: &RedisServer, key: &str) -> i64 {
    value(&redis(server, &["PTTL", key]))
        .unwrap()
        .parse()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extend_sets_the_expiry_of_the_holders_own_lock() {
    let server = RedisServer::start();
    let locks = client(server.url());
    let guard = Lock::new("import")
        .ttl(Duration::from_secs(2))
        .client(locks.clone())
        .acquire()
        .await
        .unwrap();
    assert!(pttl(&server, "lock:{import}") <= 2000);
    guard.extend(Duration::from_secs(60)).await.unwrap();
    let left = pttl(&server, "lock:{import}");
    assert!((50_000..=60_000).contains(&left), "PTTL {left}");
    assert!(
        guard.remaining() > Duration::from_secs(50),
        "{:?}",
        guard.remaining()
    );
    // Shorter sets it shorter: it sets the expiry, it does not add.
    guard.extend(Duration::from_secs(5)).await.unwrap();
    let left = pttl(&server, "lock:{import}");
    assert!((1..=5_000).contains(&left), "PTTL {left}");
    assert!(guard.remaining() <= Duration::from_secs(5));
    guard.release().await.unwrap();
    assert_eq!(redis(&server, &["EXISTS", "lock:{import}"]), ":0\r\n");

    // A renewed lock is kept by its renewals: extend is refused.
    let renewed = Lock::new("renewed")
        .ttl(Duration::from_secs(2))
        .renew()
        .client(locks.clone())
        .acquire()
        .await
        .unwrap();
    let refused = renewed.extend(Duration::from_secs(60)).await;
    assert!(matches!(refused, Err(LockError::Config(_))), "{refused:?}");
    assert!(pttl(&server, "lock:{renewed}") <= 2000);
    renewed.release().await.unwrap();

    // A ttl out of range is refused before anything is sent.
    let guard = Lock::new("range").client(locks).acquire().await.unwrap();
    let refused = guard.extend(Duration::ZERO).await;
    assert!(matches!(refused, Err(LockError::Config(_))), "{refused:?}");
    guard.release().await.unwrap();
}

/// A key that expired is not created again by `extend`, and another
/// holder's key is not touched: both are the loss they are, for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extend_never_recreates_an_expired_lock_nor_touches_anothers() {
    let server = RedisServer::start();
    let (mine, other) = (client(server.url()), client(server.url()));

    let guard = Lock::new("gone")
        .ttl(Duration::from_millis(150))
        .client(mine.clone())
        .acquire()
        .await
        .unwrap();
    wait_until_async("the key expires", LINE_TIMEOUT, || {
        redis(&server, &["EXISTS", "lock:{gone}"]) == ":0\r\n"
    })
    .await;
    match guard.extend(Duration::from_secs(60)).await {
        Err(LockError::Lost {
            cause: LostCause::Expired,
            ..
        }) => {}
        other => panic!("{other:?}"),
    }
    assert_eq!(redis(&server, &["EXISTS", "lock:{gone}"]), ":0\r\n");
    // Lost for good: a second extend and the release say so, send nothing
    // that could create it.
    assert!(matches!(
        guard.extend(Duration::from_secs(60)).await,
        Err(LockError::Lost { .. })
    ));
    assert_eq!(redis(&server, &["EXISTS", "lock:{gone}"]), ":0\r\n");
    assert!(matches!(guard.release().await, Err(LockError::Lost { .. })));

    // Expired, then taken by another client: its lock is left as it is.
    let guard = Lock::new("taken")
        .ttl(Duration::from_millis(150))
        .client(mine)
        .acquire()
        .await
        .unwrap();
    wait_until_async("the key expires", LINE_TIMEOUT, || {
        redis(&server, &["EXISTS", "lock:{taken}"]) == ":0\r\n"
    })
    .await;
    let theirs = Lock::new("taken")
        .ttl(Duration::from_secs(3))
        .client(other)
        .acquire()
        .await
        .unwrap();
    let before = value(&redis(&server, &["GET", "lock:{taken}"]));
    match guard.extend(Duration::from_secs(60)).await {
        Err(LockError::Lost {
            cause: LostCause::TakenOver,
            ..
        }) => {}
        other => panic!("{other:?}"),
    }
    assert_eq!(value(&redis(&server, &["GET", "lock:{taken}"])), before);
    assert!(pttl(&server, "lock:{taken}") <= 3000);
    theirs.release().await.unwrap();
}

/// Free, held (by this client or another), kept by `hold_at_least` after
/// its release, free again; with a Redis user that has exactly the lock's
/// ACL rule (no `zcount`: the admin `lock_info` is refused to it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holder_says_who_holds_a_lock_and_until_when_with_the_locks_own_acl() {
    let server = RedisServer::start();
    let mut args = vec!["ACL", "SETUSER", "locker", "on", ">secret"];
    args.extend_from_slice(test_support::LOCK_ACL);
    assert!(redis(&server, &args).starts_with("+OK"));
    let url = format!("redis://locker:secret@127.0.0.1:{}/", server.port());
    let (mine, other) = (client(&url), client(&url));
    let lock = |client: &Client| Lock::new("report").client(client.clone());

    assert_eq!(lock(&mine).holder().await.unwrap(), None);
    let guard = lock(&mine)
        .ttl(Duration::from_secs(20))
        .hold_at_least(Duration::from_secs(30))
        .acquire()
        .await
        .unwrap();
    let seen = lock(&other).holder().await.unwrap().expect("held");
    assert_eq!(seen.client_id, mine.id());
    assert!(!seen.this_client && !seen.kept);
    assert_eq!(seen.token_head, &guard.token()[..16]);
    assert!(
        seen.expires_in > Duration::from_secs(15) && seen.expires_in <= Duration::from_secs(20),
        "{:?}",
        seen.expires_in
    );
    assert!(lock(&mine).holder().await.unwrap().unwrap().this_client);
    // The admin call needs more than this user has.
    assert!(other.lock_info("report").await.is_err());

    // Released, kept for the rest of its 30 s: nobody holds it, nobody can
    // take it, and it says whose it was.
    guard.release().await.unwrap();
    let kept = lock(&other).holder().await.unwrap().expect("kept");
    assert!(kept.kept, "{kept:?}");
    assert_eq!(kept.client_id, mine.id());
    assert!(kept.expires_in > Duration::from_secs(20), "{kept:?}");

    redis(&server, &["DEL", "lock:{report}"]);
    assert_eq!(lock(&other).holder().await.unwrap(), None);
}

/// `holder` and `extend` through a Redis Cluster, Redis Sentinel and a
/// quorum of 3: the same answers as on one server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holder_and_extend_on_every_backend() {
    let cluster = RedisCluster::start(3, 0);
    let sentinel = RedisSentinel::try_start(0, 1).expect("a Sentinel setup");
    let nodes = [
        RedisServer::start(),
        RedisServer::start(),
        RedisServer::start(),
    ];
    let backends = [
        ("cluster", Config::cluster(cluster.urls())),
        ("sentinel", Config::new(sentinel.url(""))),
        ("quorum", Config::new(quorum_url(&nodes))),
    ];
    for (backend, config) in backends {
        let (mine, other) = (
            Client::new(config.clone()).unwrap(),
            Client::new(config).unwrap(),
        );
        let name = format!("{backend}-job");
        let lock = |client: &Client| Lock::new(name.as_str()).client(client.clone());
        assert_eq!(lock(&other).holder().await.unwrap(), None, "{backend}");
        let guard = lock(&mine)
            .ttl(Duration::from_secs(3))
            .acquire()
            .await
            .unwrap();
        let seen = lock(&other).holder().await.unwrap().expect(backend);
        assert_eq!(seen.client_id, mine.id(), "{backend}");
        assert!(
            seen.expires_in <= Duration::from_secs(3),
            "{backend} {seen:?}"
        );

        guard.extend(Duration::from_secs(60)).await.unwrap();
        let seen = lock(&other).holder().await.unwrap().expect(backend);
        assert!(
            seen.expires_in > Duration::from_secs(50),
            "{backend} {seen:?}"
        );
        assert!(guard.remaining() > Duration::from_secs(50), "{backend}");

        guard.release().await.unwrap();
        assert_eq!(lock(&other).holder().await.unwrap(), None, "{backend}");
    }
}

/// A `Config` from the `redis` crate's `ConnectionInfo`: the address, the
/// database, the user and a password with characters a URL must escape.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_config_from_a_redis_connection_info_locks_on_that_server() {
    use redis::IntoConnectionInfo;

    let server = RedisServer::start();
    let password = "p@ss/w:rd#?";
    let reply = redis(
        &server,
        &[
            "ACL",
            "SETUSER",
            "app",
            "on",
            &format!(">{password}"),
            "~*",
            "&*",
            "+@all",
        ],
    );
    assert!(reply.starts_with("+OK"), "{reply}");
    let info = redis::ConnectionAddr::Tcp("127.0.0.1".to_owned(), server.port())
        .into_connection_info()
        .unwrap()
        .set_redis_settings(
            redis::RedisConnectionInfo::default()
                .set_db(3)
                .set_username("app")
                .set_password(password),
        );
    let config = Config::from_connection_info(&info);
    assert!(!format!("{config:?}").contains("w:rd"), "{config:?}");
    let locks = Client::new(config).unwrap();
    let guard = Lock::new("from-info")
        .client(locks)
        .acquire()
        .await
        .unwrap();
    // In database 3, logged in as `app`: read with the same settings.
    let mut direct = redis::Client::open(info)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let exists: bool = redis::cmd("EXISTS")
        .arg("lock:{from-info}")
        .query_async(&mut direct)
        .await
        .unwrap();
    assert!(exists, "the lock is in database 3");
    assert_eq!(redis(&server, &["EXISTS", "lock:{from-info}"]), ":0\r\n");
    guard.release().await.unwrap();
    let exists: bool = redis::cmd("EXISTS")
        .arg("lock:{from-info}")
        .query_async(&mut direct)
        .await
        .unwrap();
    assert!(!exists);
}

/// The servers these tests start are the binary `REDIS_SERVER` names
/// (test-support): under the test command's Valkey matrix, valkey-server.
#[test]
fn the_server_started_is_the_one_named() {
    let server = RedisServer::start();
    let info = redis(&server, &["INFO", "server"]);
    let named = std::env::var_os(test_support::REDIS_SERVER_ENV)
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| "redis-server".into());
    let version = std::process::Command::new(&named)
        .arg("--version")
        .output()
        .expect("the server binary runs");
    let valkey = String::from_utf8_lossy(&version.stdout).starts_with("Valkey");
    assert_eq!(info.contains("valkey_version:"), valkey, "{info}");
}

/// The shortest ttl the attribute accepts (1 ms; 2 ms) gives a lock no
/// validity past its drift margin however fast Redis answers: it is still
/// handed out (as it always was), not refused as a reply that came after
/// the lock's validity (`hold::late_reply`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_of_the_shortest_ttls_are_taken() {
    let server = RedisServer::start();
    let client = Client::new(Config::new(server.url())).unwrap();
    for ttl in [1, 2] {
        let guard = Lock::new(format!("shortest-{ttl}"))
            .ttl(Duration::from_millis(ttl))
            .client(client.clone())
            .try_acquire()
            .await;
        assert!(guard.is_ok(), "ttl {ttl} ms: {:?}", guard.map(drop));
    }
    // And a set taken key by key (names in two slots of a Cluster), checked
    // key by key for a validity over once every key is taken. (A quorum
    // takes no ttl under 10 ms.)
    let cluster = RedisCluster::start(3, 0);
    let set = Lock::all(["shortest-a", "shortest-b"])
        .ttl(Duration::from_millis(1))
        .client(Client::new(Config::cluster(cluster.urls())).unwrap())
        .try_acquire()
        .await;
    assert!(set.is_ok(), "a set of 1 ms: {:?}", set.map(drop));
}
