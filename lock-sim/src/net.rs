//! The client's side of the simulated network: lock-runtime's `Network`
//! and `Conn` (the transport seam, docs/design.md §10), each connection a
//! handle on the world's.

use std::sync::Arc;

use lock_runtime::simulation::{BoxFuture, Conn, Network, Push};
use redis::{RedisResult, Value};
use tokio::sync::{mpsc, oneshot, Mutex};

use crate::world::Shared;

/// One client's network (each client has its own, to know whose
/// connections are whose).
pub struct SimNetwork {
    pub shared: Arc<Shared>,
    pub client: usize,
}

impl Network for SimNetwork {
    fn connect(&self, address: &str) -> BoxFuture<'static, RedisResult<Arc<dyn Conn>>> {
        let (shared, client, address) = (Arc::clone(&self.shared), self.client, address.to_owned());
        Box::pin(async move {
            let delay = shared.with(|world| world.connect_delay());
            tokio::time::sleep(delay).await;
            let (id, pushes) = shared.with(|world| world.open(client, &address))?;
            Ok(Arc::new(SimConn {
                shared,
                id,
                pushes: Arc::new(Mutex::new(pushes)),
            }) as Arc<dyn Conn>)
        })
    }
}

struct SimConn {
    shared: Arc<Shared>,
    id: u64,
    pushes: Arc<Mutex<mpsc::UnboundedReceiver<Push>>>,
}

impl Conn for SimConn {
    fn send(&self, commands: Vec<Vec<Vec<u8>>>) -> BoxFuture<'static, RedisResult<Vec<Value>>> {
        let (reply, replied) = oneshot::channel();
        self.shared
            .with(|world| world.send(self.id, commands, reply));
        Box::pin(async move {
            match replied.await {
                Ok(result) => result,
                // No reply will ever come (a lost reply, a stalled node):
                // the client's deadline ends the call, as over TCP.
                Err(_) => std::future::pending().await,
            }
        })
    }

    fn next_push(&self) -> BoxFuture<'static, Option<Push>> {
        let pushes = Arc::clone(&self.pushes);
        Box::pin(async move { pushes.lock().await.recv().await })
    }
}

impl Drop for SimConn {
    fn drop(&mut self) {
        self.shared.with(|world| world.close(self.id));
    }
}
