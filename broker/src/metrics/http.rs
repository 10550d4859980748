//! The admin listener: `GET /metrics`, `/healthz` and `/readyz`.

use super::render::render;
use super::MetricsSnapshot;
use crate::net::{accept_next, AcceptFailures};
use crate::shard::{ShardContext, ShardOp, ShardReply};
use futures_lite::{AsyncReadExt, AsyncWriteExt};
use glommio::net::TcpListener;
use shardlog_schema::ShardId;
use std::rc::Rc;

/// Largest HTTP request head the admin listener reads.
const HTTP_HEAD_BYTES_MAX: usize = 8 << 10;

/// Whether every shard serves, for `/readyz`. Shared by the shard threads
/// (each counts itself in once it accepts, out when it stops) and read only
/// by the admin listener: never touched on the data path.
#[derive(Clone)]
pub struct Health {
    serving: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    shards: usize,
}

impl Health {
    #[must_use]
    pub fn new(shards: usize) -> Health {
        Health { serving: std::sync::Arc::default(), shards }
    }

    /// This shard has recovered its logs and accepts connections.
    pub fn shard_serving(&self) {
        self.serving.fetch_add(1, std::sync::atomic::Ordering::Release);
    }

    /// This shard is shutting down.
    pub fn shard_stopping(&self) {
        self.serving.fetch_sub(1, std::sync::atomic::Ordering::Release);
    }

    /// `Ok` when every shard serves, else how many do.
    pub fn ready(&self) -> Result<(), String> {
        let serving = self.serving.load(std::sync::atomic::Ordering::Acquire);
        if serving == self.shards {
            Ok(())
        } else {
            Err(format!("{serving} of {} shards serving (recovering logs, or stopping)", self.shards))
        }
    }
}

/// The admin port's answer to one request line: (status, body).
async fn route(ctx: &Rc<ShardContext>, health: &Health, line: &[u8]) -> (&'static str, String) {
    let path =
        line.strip_prefix(b"GET ").and_then(|rest| rest.split(|b| *b == b' ').next()).unwrap_or_default();
    let path = path.split(|b| *b == b'?').next().unwrap_or_default();
    match path {
        b"/metrics" => ("200 OK", render(&collect(ctx).await)),
        // The process is alive and its admin listener answers.
        b"/healthz" => ("200 OK", "ok\n".to_string()),
        b"/readyz" => match health.ready() {
            Ok(()) => ("200 OK", "ready\n".to_string()),
            Err(why) => ("503 Service Unavailable", format!("not ready: {why}\n")),
        },
        _ => ("404 Not Found", "try GET /metrics, /healthz or /readyz\n".to_string()),
    }
}

/// Serves `GET /metrics`, `/healthz` and `/readyz` (runs on shard 0, from
/// before its logs are recovered). A failing accept backs off as the data
/// listeners' do (`net::accept_next`).
pub async fn admin_loop(ctx: Rc<ShardContext>, listener: TcpListener, health: Health) {
    let mut failures = AcceptFailures::default();
    loop {
        let Some(mut stream) = accept_next(&ctx, &listener, "admin", &mut failures).await else {
            return;
        };
        let (ctx, health) = (ctx.clone(), health.clone());
        glommio::spawn_local(async move {
            let mut head = Vec::with_capacity(1024);
            let mut buf = [0u8; 1024];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < HTTP_HEAD_BYTES_MAX {
                match stream.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => head.extend_from_slice(&buf[..n]),
                }
            }
            let line = head.split(|b| *b == b'\n').next().unwrap_or_default();
            let (status, body) = route(&ctx, &health, line).await;
            let resp = format!(
                "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _gone = stream.write_all(resp.as_bytes()).await;
            let _gone = stream.close().await;
        })
        .detach();
    }
}

async fn collect(ctx: &Rc<ShardContext>) -> Vec<MetricsSnapshot> {
    let mut out = Vec::with_capacity(ctx.shard_count as usize);
    for s in 0..ctx.shard_count {
        match ctx.call(ShardId(s), ShardOp::Metrics).await {
            ShardReply::Metrics(m) => out.push(*m),
            _ => out.push(MetricsSnapshot::default()),
        }
    }
    out
}
