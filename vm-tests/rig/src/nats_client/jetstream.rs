//! A blocking JetStream context: open and delete KV buckets, read a stream's info.

use super::connection::Connection;
use super::kv::Store;
use super::runtime::{block_on, io_error};
use std::io;

/// A stream's configuration and state (`state.messages`, …) as JetStream reports it.
pub type StreamInfo = async_nats::jetstream::stream::Info;

/// A JetStream context on a connection.
#[derive(Clone)]
pub struct JetStream {
    ctx: async_nats::jetstream::Context,
}

/// The JetStream context of `conn` (made on the rig's runtime: async-nats starts a task for it).
pub fn new(conn: Connection) -> JetStream {
    let client = conn.client().clone();
    JetStream {
        ctx: block_on(async move { async_nats::jetstream::new(client) }),
    }
}

impl JetStream {
    /// Opens the existing KV bucket `bucket`.
    pub fn key_value(&self, bucket: impl AsRef<str>) -> io::Result<Store> {
        let (ctx, bucket) = (self.ctx.clone(), bucket.as_ref().to_owned());
        block_on(async move { ctx.get_key_value(bucket).await })
            .map(Store::new)
            .map_err(io_error)
    }

    /// Deletes the KV bucket `bucket` (its stream).
    pub fn delete_key_value(&self, bucket: impl AsRef<str>) -> io::Result<()> {
        let (ctx, bucket) = (self.ctx.clone(), bucket.as_ref().to_owned());
        block_on(async move { ctx.delete_key_value(bucket).await })
            .map(drop)
            .map_err(io_error)
    }

    /// The info of the stream `stream`.
    pub fn stream_info(&self, stream: impl AsRef<str>) -> io::Result<StreamInfo> {
        let (ctx, stream) = (self.ctx.clone(), stream.as_ref().to_owned());
        block_on(async move {
            let mut s = ctx.get_stream(stream).await.map_err(io_error)?;
            s.info().await.cloned().map_err(io_error)
        })
    }
}
