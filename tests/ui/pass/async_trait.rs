//! `#[distributed_lock]` on the methods of an `#[async_trait]` impl (a tonic
//! service's shape): async-trait expands first and hands the attribute a
//! `fn .. -> Pin<Box<dyn Future<..> + Send>>`. Every receiver, a plain and a
//! destructured parameter, `client = self...`, each return type, a set of
//! keys, a trait's default method, `?Send` traits, and stacked with
//! `#[tracing::instrument]` in both orders.
use std::sync::Arc;

use async_trait::async_trait;
use lock_runtime::{distributed_lock, Client, LockError};

pub struct Request<T>(pub T);
pub struct Status;
impl From<LockError> for Status {
    fn from(_: LockError) -> Self {
        Status
    }
}

#[async_trait]
pub trait Orders: Send + Sync + 'static {
    async fn settle(&self, id: u64) -> Result<String, Status>;
    async fn refund(&self, request: Request<(u32, u64)>) -> Option<u64>;
    async fn audit(&mut self, (shop, id): (u32, u64));
    async fn close(self: Arc<Self>, ids: Vec<u64>) -> Result<usize, LockError>;
    async fn traced(&self, id: u64) -> Result<u64, LockError>;
    async fn traced_inside(&self, id: u64) -> Result<u64, LockError>;
    async fn borrowed(&self, name: &str, pair: &(u32, u32)) -> Result<usize, LockError>;

    #[distributed_lock(key = "default:<id>")]
    async fn provided(&self, id: u64) -> Result<u64, LockError> {
        Ok(id)
    }
}

pub struct Service {
    locks: Client,
    shard: u32,
}

#[async_trait]
impl Orders for Service {
    #[distributed_lock(key = "order:<self.shard>:<id>", wait = "2s", client = self.locks)]
    async fn settle(&self, id: u64) -> Result<String, Status> {
        Ok(format!("{id} on {}", self.shard))
    }

    #[distributed_lock(key = "refund:<request.0.1>", renew, client = self.locks)]
    async fn refund(&self, request: Request<(u32, u64)>) -> Option<u64> {
        Some(request.0 .1 + u64::from(self.shard))
    }

    #[distributed_lock(key = "audit:<shop>:<id>", client = self.locks)]
    async fn audit(&mut self, (shop, mut id): (u32, u64)) {
        id += 1;
        self.shard = shop + id as u32;
    }

    #[distributed_lock(key = ["close:<self.shard>", "ledger"], wait = "1s", client = self.locks)]
    async fn close(self: Arc<Self>, ids: Vec<u64>) -> Result<usize, LockError> {
        Ok(ids.len())
    }

    #[distributed_lock(key = "traced:<id>", client = self.locks)]
    #[tracing::instrument(skip(self))]
    async fn traced(&self, id: u64) -> Result<u64, LockError> {
        Ok(id)
    }

    #[tracing::instrument(skip(self))]
    #[distributed_lock(key = "traced:<id>", client = self.locks)]
    async fn traced_inside(&self, id: u64) -> Result<u64, LockError> {
        Ok(id)
    }

    #[distributed_lock(key = "borrowed:<name>:<pair.0>", client = self.locks)]
    async fn borrowed(&self, name: &str, pair: &(u32, u32)) -> Result<usize, LockError> {
        Ok(name.len() + pair.1 as usize)
    }
}

/// A `?Send` trait: async-trait's future is not `Send`.
#[async_trait(?Send)]
pub trait Local {
    async fn local(&self, id: u64) -> Result<u64, LockError>;
}

#[async_trait(?Send)]
impl Local for Service {
    #[distributed_lock(key = "local:<id>", client = self.locks)]
    async fn local(&self, id: u64) -> Result<u64, LockError> {
        let not_send = std::rc::Rc::new(id);
        Ok(*not_send)
    }
}

/// The futures are `Send`, as a tonic service needs.
fn assert_send<T: Send>(_: T) {}

/// Type-checked only: no Redis is reached.
#[allow(dead_code)]
fn futures_are_send(service: Arc<Service>) {
    assert_send(service.settle(1));
    assert_send(service.refund(Request((1, 2))));
    assert_send(service.clone().close(vec![1]));
    assert_send(service.traced(1));
    assert_send(service.traced_inside(1));
    assert_send(service.provided(1));
    assert_send(service.borrowed("a", &(1, 2)));
    let _ = service.local(1);
}

fn main() {}
