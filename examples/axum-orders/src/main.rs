//! An axum service that settles orders, one request per order at a time across
//! every instance of the service.
//!
//! `POST /orders/{id}/settle` adds 1 to the order's balance in Redis with a
//! plain read-modify-write (GET, a little work, SET): without a lock, two
//! concurrent requests would both read the same balance and one update would
//! be lost. The handler is annotated with `#[distributed_lock]`, its key built
//! from the destructured `Path(id)` and its client taken from the app state
//! (`client = app.locks`). A request that cannot get the lock within 2 s gets
//! 423 Locked.
//!
//! ```sh
//! REDIS_URL=redis://127.0.0.1:6379/ PORT=3000 cargo run -p axum-orders
//! curl -X POST http://127.0.0.1:3000/orders/42/settle   # {"id":42,"balance":1}
//! ```
//!
//! `PORT` defaults to 3000; `PORT=0` picks a free port. The service prints
//! `listening on <port>` once bound. `tests/two_instances.rs` runs two
//! instances against one Redis.

use std::net::Ipv4Addr;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use lock_runtime::{distributed_lock, Client, Config, LockError};
use redis::aio::ConnectionManager;
use redis::AsyncCommands;
use serde::Serialize;

#[derive(Clone)]
struct App {
    /// The lock client (one connection, shared by every request).
    locks: Client,
    /// The application's own Redis connection, for the balances.
    redis: ConnectionManager,
}

#[derive(Serialize)]
struct Settled {
    id: u64,
    balance: i64,
}

#[distributed_lock(key = "order:<id>", ttl = "10s", wait = "2s", client = app.locks)]
async fn settle(State(app): State<App>, Path(id): Path<u64>) -> Result<Json<Settled>, ApiError> {
    // Not atomic on purpose: only the lock keeps two requests apart.
    let mut redis = app.redis.clone();
    let key = format!("balance:{id}");
    let balance: Option<i64> = redis.get(&key).await?;
    tokio::time::sleep(Duration::from_millis(5)).await;
    let balance = balance.unwrap_or(0) + 1;
    let () = redis.set(&key, balance).await?;
    Ok(Json(Settled { id, balance }))
}

enum ApiError {
    Lock(LockError),
    Redis(redis::RedisError),
}

impl From<LockError> for ApiError {
    fn from(error: LockError) -> Self {
        ApiError::Lock(error)
    }
}

impl From<redis::RedisError> for ApiError {
    fn from(error: redis::RedisError) -> Self {
        ApiError::Redis(error)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        match self {
            // Another request for this order held the lock for the whole wait.
            ApiError::Lock(error) if error.is_busy() => {
                (StatusCode::LOCKED, error.to_string()).into_response()
            }
            ApiError::Lock(error) => {
                (StatusCode::SERVICE_UNAVAILABLE, error.to_string()).into_response()
            }
            ApiError::Redis(error) => {
                (StatusCode::INTERNAL_SERVER_ERROR, error.to_string()).into_response()
            }
        }
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("REDIS_URL").map_err(|_| "set REDIS_URL, e.g. redis://127.0.0.1/")?;
    let port: u16 = match std::env::var("PORT") {
        Ok(port) => port.parse().map_err(|_| "PORT must be a port number")?,
        Err(_) => 3000,
    };
    let app = App {
        locks: Client::new(Config::new(url.clone()))?,
        redis: redis::Client::open(url)?.get_connection_manager().await?,
    };
    let router = Router::new()
        .route("/orders/{id}/settle", post(settle))
        .with_state(app);

    let listener = tokio::net::TcpListener::bind((Ipv4Addr::LOCALHOST, port)).await?;
    println!("listening on {}", listener.local_addr()?.port());
    axum::serve(listener, router).await?;
    Ok(())
}
