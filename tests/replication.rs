//! A primary with a replica (one server, not a cluster): acknowledged mode
//! (`Config::acknowledged`: every acquisition and renewal waits for
//! replicas to confirm it with `WAIT`), with the replica stopped (SIGSTOP)
//! as the fault.

mod common;
use common::*;
use std::time::{Duration, Instant};

use lock_runtime::{Client, Config, Lock, LockError};

/// A primary and a replica of it, in sync.
fn primary_with_replica() -> (RedisServer, RedisServer) {
    let primary = RedisServer::start();
    let replica_port = test_support::free_port().unwrap();
    let replica = RedisServer::start_with(
        replica_port,
        &[
            "--replicaof".to_owned(),
            "127.0.0.1".to_owned(),
            primary.port().to_string(),
        ],
    )
    .unwrap();
    wait_until("the replica is in sync", LINE_TIMEOUT, || {
        redis(&replica, &["INFO", "replication"]).contains("master_link_status:up")
    });
    (primary, replica)
}

fn acknowledged(primary: &RedisServer) -> Client {
    Client::new(Config::new(primary.url()).acknowledged(1, Duration::from_millis(200))).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquisition_replicas_do_not_confirm_fails_and_is_given_back() {
    let (primary, replica) = primary_with_replica();
    let client = acknowledged(&primary);
    // Confirmed: the replica has it.
    let guard = Lock::new("acked")
        .client(client.clone())
        .try_acquire()
        .await
        .unwrap();
    assert_eq!(
        value(&redis(&replica, &["GET", "lock:{acked}"])).as_deref(),
        Some(guard.token())
    );
    guard.release().await.unwrap();

    signal(&replica, "-STOP");
    for lock in [
        Lock::new("acked").client(client.clone()),
        Lock::new("acked").fencing().client(client.clone()),
        Lock::new("acked")
            .wait(Duration::from_secs(5))
            .client(client.clone()),
    ] {
        let started = Instant::now();
        let refused = lock.try_acquire().await;
        assert!(
            matches!(
                refused,
                Err(LockError::NotReplicated {
                    confirmed: Some(0),
                    wanted: 1,
                    ..
                })
            ),
            "{refused:?}"
        );
        assert!(started.elapsed() < Duration::from_secs(2));
        // Given back: nobody holds it.
        assert_eq!(redis(&primary, &["EXISTS", "lock:{acked}"]), ":0\r\n");
    }
    let message = Lock::new("acked")
        .client(client.clone())
        .try_acquire()
        .await
        .unwrap_err()
        .to_string();
    assert!(message.contains("0 of the 1 replicas"), "{message}");
    // Without acknowledged mode the same acquisition succeeds.
    let unacknowledged = Client::new(Config::new(primary.url())).unwrap();
    let guard = Lock::new("acked")
        .client(unacknowledged)
        .try_acquire()
        .await
        .unwrap();
    signal(&replica, "-CONT");
    guard.release().await.unwrap();
    // Confirmed again once the replica is back.
    Lock::new("acked")
        .client(client)
        .try_acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_replicas_do_not_confirm_counts_as_failed_until_the_lock_is_lost() {
    let (primary, replica) = primary_with_replica();
    let client = acknowledged(&primary);
    let guard = Lock::new("renewed")
        .ttl(Duration::from_millis(900))
        .renew()
        .client(client.clone())
        .try_acquire()
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1000)).await; // renewed, confirmed
    assert!(guard.is_held());
    assert_eq!(client.renewal_stats().failed_round_trips, 0);
    signal(&replica, "-STOP");
    // The primary still extends the key, but no renewal is confirmed: the
    // holder is told it lost the lock by the end of its validity.
    let stopped = Instant::now();
    wait_until_async("the holder is told", LINE_TIMEOUT, || !guard.is_held()).await;
    assert!(stopped.elapsed() < Duration::from_millis(900 + 1000));
    assert!(client.renewal_stats().failed_round_trips > 0);
    signal(&replica, "-CONT");
    assert!(matches!(guard.release().await, Err(LockError::Lost { .. })));
}
