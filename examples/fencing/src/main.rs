//! Fencing tokens, end to end (Kleppmann, "How to do distributed locking").
//!
//! A lease-based lock cannot stop a holder that was paused past its ttl from
//! writing once it wakes up: by then another holder has the lock. What can
//! stop the write is the store: every write carries the writer's fencing
//! token, and the store rejects a token smaller than the largest it has
//! seen. `cargo run -p fencing` starts a throwaway redis-server (unless
//! `REDIS_URL` is set) and plays the story:
//!
//! 1. client 1 takes the lock (token t1) and is paused (a long GC pause);
//! 2. its ttl runs out; client 2 takes the lock (token t2 > t1) and writes;
//! 3. client 1 wakes up and writes with t1: the store rejects it.

use std::sync::Mutex;
use std::time::Duration;

use lock_runtime::{Client, Config, Lock};
use test_support::RedisServer;

/// The downstream store: here in memory; in real life a database row with a
/// `fence` column and `UPDATE ... WHERE fence < $token`, or an object store
/// with a conditional put.
#[derive(Default)]
struct FencedStore {
    state: Mutex<(u64, String)>,
}

impl FencedStore {
    /// Applies the write only if `token` is not older than any token seen.
    fn write(&self, token: u64, value: &str) -> Result<(), String> {
        let mut state = self.state.lock().unwrap();
        if token < state.0 {
            return Err(format!("rejected: token {token} is older than {}", state.0));
        }
        *state = (token, value.to_owned());
        Ok(())
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (_server, url) = match std::env::var("REDIS_URL") {
        Ok(url) if !url.is_empty() => (None, url),
        _ => {
            let server = RedisServer::start();
            let url = server.url();
            (Some(server), url)
        }
    };
    let store = FencedStore::default();
    let lock = |client: Client| {
        Lock::new("invoice:42")
            .ttl(Duration::from_millis(300))
            .fencing()
            .client(client)
    };

    let client1 = Client::new(Config::new(url.clone()))?;
    let client2 = Client::new(Config::new(url))?;

    let first = lock(client1).acquire().await?;
    let first_fence = first.fencing_token().expect("taken with .fencing()");
    println!("client 1 holds the lock with fencing token {first_fence}");
    println!("client 1 pauses for 500 ms (a GC pause); its 300 ms ttl runs out");
    tokio::time::sleep(Duration::from_millis(500)).await;

    let second = lock(client2).acquire().await?;
    let second_fence = second.fencing_token().expect("taken with .fencing()");
    println!("client 2 holds the lock with fencing token {second_fence}");
    store.write(second_fence, "written by client 2")?;
    println!("client 2 writes: accepted");
    second.release().await?;

    match store.write(first_fence, "written by client 1") {
        Ok(()) => println!("client 1 writes: accepted (this must not happen)"),
        Err(reason) => println!("client 1 wakes up and writes: {reason}"),
    }
    println!("the store holds: {:?}", store.state.lock().unwrap().1);
    let _ = first.release().await; // reports the loss
    Ok(())
}
