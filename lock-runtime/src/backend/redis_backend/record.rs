//! A client's holder record on one server or a Redis Cluster (the
//! record's hash tag picks its slot): written by `record.lua`, read by
//! `HGETALL`.

use std::collections::HashMap;

use super::RedisBackend;
use crate::backend::scripts::{evalsha, run, RECORD};
use crate::backend::RecordWrite;
use crate::error::LockError;

impl RedisBackend {
    /// One `record.lua` call: whether the record existed before it.
    pub(crate) async fn write_holder_record(
        &self,
        write: &RecordWrite<'_>,
    ) -> Result<bool, LockError> {
        let args = 4 + 2 * write.set.len() + write.delete.len();
        let bytes = write.key.len()
            + 32
            + write
                .set
                .iter()
                .map(|(field, value)| field.len() + value.len())
                .sum::<usize>()
            + write.delete.iter().map(String::len).sum::<usize>();
        let mut cmd = evalsha(&RECORD, 1, args, bytes);
        cmd.arg(write.key)
            .arg(write.ttl_ms)
            .arg(if write.replace { "1" } else { "0" })
            .arg(write.set.len());
        for (field, value) in write.set {
            cmd.arg(field).arg(value);
        }
        for field in write.delete {
            cmd.arg(field);
        }
        let (cmd, scripts) = (&cmd, self.connection.scripts());
        let existed: i64 = self
            .call(
                write.key,
                "write of the holder record",
                |mut connection, _| async move { run(&RECORD, cmd, &mut connection, scripts).await },
            )
            .await?;
        Ok(existed == 1)
    }

    /// `HGETALL` of a holder record.
    pub(crate) async fn read_holder_record(
        &self,
        key: &str,
    ) -> Result<Vec<(String, String)>, LockError> {
        let mut cmd = redis::cmd("HGETALL");
        cmd.arg(key);
        let cmd = &cmd;
        let fields: HashMap<String, String> = self
            .call(
                key,
                "read of the holder record",
                |mut connection, _| async move { cmd.query_async(&mut connection).await },
            )
            .await?;
        let mut fields: Vec<(String, String)> = fields.into_iter().collect();
        fields.sort();
        Ok(fields)
    }
}
