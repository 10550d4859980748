//! Cluster state shared by one client: cached metadata and one connection per
//! shard address. Touched on metadata refreshes and connection set-up only,
//! never per record, so plain mutexes (never held across an `.await`) suffice.

use crate::config::ClientConfig;
use crate::conn::{ConnOptions, Connection};
use crate::error::{ClientError, Result};
use crate::protocol::{self, ClusterMetadata, OffsetAnswer, OffsetQuery, TopicMetadata};
use shardlog_schema::frame::FrameLimits;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Splits a bootstrap list (`host:port[,host:port...]`).
pub(crate) fn parse_bootstrap(list: &str) -> Result<Vec<String>> {
    let addrs: Vec<String> =
        list.split(',').map(str::trim).filter(|a| !a.is_empty()).map(str::to_string).collect();
    if addrs.is_empty() {
        return Err(ClientError::Config("bootstrap address is empty".into()));
    }
    if let Some(bad) = addrs
        .iter()
        .find(|a| a.rsplit_once(':').is_none_or(|(h, p)| h.is_empty() || p.parse::<u16>().is_err()))
    {
        return Err(ClientError::Config(format!("bootstrap address `{bad}` is not host:port")));
    }
    Ok(addrs)
}

pub(crate) struct Cluster {
    pub config: ClientConfig,
    opts: ConnOptions,
    metadata: Mutex<Arc<ClusterMetadata>>,
    conns: Mutex<HashMap<String, Connection>>,
    /// The configured bootstrap addresses (`bootstrap` split at commas).
    bootstrap: Vec<String>,
    /// Index (in `bootstrap_addrs`) of the address that answered last.
    bootstrap_at: std::sync::atomic::AtomicUsize,
}

impl Cluster {
    /// Connects to the bootstrap broker and loads metadata for `topics`
    /// (all topics when `None`).
    pub async fn connect(config: ClientConfig, topics: Option<&[String]>) -> Result<Arc<Cluster>> {
        let bootstrap = parse_bootstrap(&config.bootstrap)?;
        let opts = ConnOptions {
            max_in_flight: config.max_in_flight,
            request_timeout: Duration::from_millis(config.request_timeout_ms),
            connect_timeout: Duration::from_millis(config.connect_timeout_ms),
            limits: FrameLimits {
                header_bytes_max: config.response_header_bytes_max,
                payload_bytes_max: config.response_payload_bytes_max,
            },
        };
        let cluster = Arc::new(Cluster {
            config,
            opts,
            metadata: Mutex::new(Arc::new(ClusterMetadata::default())),
            conns: Mutex::new(HashMap::new()),
            bootstrap,
            bootstrap_at: std::sync::atomic::AtomicUsize::new(0),
        });
        cluster.refresh(topics).await?;
        Ok(cluster)
    }

    fn lock_conns(&self) -> std::sync::MutexGuard<'_, HashMap<String, Connection>> {
        self.conns.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The id of the live connection to `addr`, if there is one now.
    pub fn live_connection_id(&self, addr: &str) -> Option<u64> {
        self.lock_conns().get(addr).filter(|c| !c.is_closed()).map(Connection::id)
    }

    /// The live connection to `addr`, connecting when needed.
    pub async fn connection(&self, addr: &str) -> Result<Connection> {
        if let Some(c) = self.lock_conns().get(addr) {
            if !c.is_closed() {
                return Ok(c.clone());
            }
        }
        let fresh = Connection::connect(addr, self.opts).await?;
        let mut conns = self.lock_conns();
        // Another task may have connected meanwhile; keep one connection per address.
        match conns.get(addr) {
            Some(c) if !c.is_closed() => Ok(c.clone()),
            _ => {
                conns.insert(addr.to_string(), fresh.clone());
                Ok(fresh)
            }
        }
    }

    /// The addresses metadata and admin requests may go to: the configured
    /// bootstrap list, then every broker the last metadata named.
    fn bootstrap_addrs(&self) -> Vec<String> {
        let mut addrs = self.bootstrap.clone();
        for b in &self.metadata().brokers {
            let addr = format!("{}:{}", b.host, b.port);
            if !addrs.contains(&addr) {
                addrs.push(addr);
            }
        }
        addrs
    }

    /// A bootstrap connection (metadata and admin requests go there): the
    /// address that answered last, else the next that connects.
    pub async fn bootstrap(&self) -> Result<Connection> {
        self.on_bootstrap(|conn| async move { Ok(conn) }).await
    }

    /// Runs `call` on a bootstrap connection, moving on to the next address
    /// when connecting or the call fails for the connection's sake (I/O,
    /// closed, timed out); any other error is the answer.
    pub async fn on_bootstrap<T, F, Fut>(&self, call: F) -> Result<T>
    where
        F: Fn(Connection) -> Fut,
        Fut: std::future::Future<Output = Result<T>>,
    {
        self.on_bootstrap_avoiding(None, call).await
    }

    /// [`Self::on_bootstrap`], trying the bootstrap address `avoid` (a
    /// broker holding a request too long) last.
    async fn on_bootstrap_avoiding<T, F, Fut>(&self, avoid: Option<&str>, call: F) -> Result<T>
    where
        F: Fn(Connection) -> Fut,
        Fut: std::future::Future<Output = Result<T>>,
    {
        use std::sync::atomic::Ordering;
        let addrs = self.bootstrap_addrs();
        let start = self.bootstrap_at.load(Ordering::Relaxed);
        let mut order: Vec<usize> = (0..addrs.len()).map(|i| (start + i) % addrs.len()).collect();
        if let Some(avoid) = avoid {
            order.sort_by_key(|&at| addrs[at] == avoid);
        }
        let mut last = None;
        for at in order {
            let outcome = match self.connection(&addrs[at]).await {
                Ok(conn) => call(conn).await,
                Err(e) => Err(e),
            };
            match outcome {
                Err(
                    e @ (ClientError::Io { .. } | ClientError::ConnectionClosed(_) | ClientError::Timeout),
                ) => {
                    tracing::debug!(addr = %addrs[at], error = %e, "bootstrap broker unavailable; trying the next");
                    last = Some(e);
                }
                other => {
                    self.bootstrap_at.store(at, Ordering::Relaxed);
                    return other;
                }
            }
        }
        Err(last.unwrap_or_else(|| ClientError::Config("no bootstrap address".into())))
    }

    /// The cached metadata.
    pub fn metadata(&self) -> Arc<ClusterMetadata> {
        self.metadata.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// Fetches metadata (for `topics`, or all) without touching the cache.
    pub async fn fetch_metadata(&self, topics: Option<&[String]>) -> Result<ClusterMetadata> {
        self.fetch_metadata_avoiding(topics, None).await
    }

    async fn fetch_metadata_avoiding(
        &self,
        topics: Option<&[String]>,
        avoid: Option<&str>,
    ) -> Result<ClusterMetadata> {
        let client_id = &self.config.client_id;
        self.on_bootstrap_avoiding(avoid, |conn| async move {
            let raw =
                conn.call(|corr| protocol::encode_metadata(corr, client_id, topics), Vec::new()).await?;
            protocol::decode_metadata(&raw)
        })
        .await
    }

    /// Refreshes the cache: all topics when `None`, else only those named
    /// (topics the broker no longer knows are dropped from the cache).
    pub async fn refresh(&self, topics: Option<&[String]>) -> Result<Arc<ClusterMetadata>> {
        self.refresh_avoiding(topics, None).await
    }

    /// [`Self::refresh`], asking the broker that owns the shard address
    /// `stalled` last: it holds a request too long, and may be frozen.
    pub async fn refresh_around(
        &self,
        topics: Option<&[String]>,
        stalled: &str,
    ) -> Result<Arc<ClusterMetadata>> {
        let avoid = self.broker_addr_of(stalled);
        self.refresh_avoiding(topics, avoid.as_deref()).await
    }

    /// The public address of the broker one of whose shards listens at
    /// `shard_addr`, as the cached metadata names it.
    fn broker_addr_of(&self, shard_addr: &str) -> Option<String> {
        let (host, port) = shard_addr.rsplit_once(':')?;
        let port: u16 = port.parse().ok()?;
        let md = self.metadata();
        let b = md
            .brokers
            .iter()
            .find(|b| b.host == host && (b.port == port || b.shard_ports.iter().any(|&(_, p)| p == port)))?;
        Some(format!("{}:{}", b.host, b.port))
    }

    async fn refresh_avoiding(
        &self,
        topics: Option<&[String]>,
        avoid: Option<&str>,
    ) -> Result<Arc<ClusterMetadata>> {
        let fresh = self.fetch_metadata_avoiding(topics, avoid).await?;
        let mut guard = self.metadata.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let merged = match topics {
            None => fresh,
            Some(names) => {
                let mut merged = ClusterMetadata {
                    brokers: fresh.brokers,
                    controller_id: fresh.controller_id,
                    topics: guard.topics.iter().filter(|t| !names.contains(&t.name)).cloned().collect(),
                };
                merged
                    .topics
                    .extend(fresh.topics.into_iter().filter(|t| t.error == shardlog_schema::ErrorCode::None));
                merged
            }
        };
        *guard = Arc::new(merged);
        Ok(guard.clone())
    }

    /// Metadata of one topic, from the cache or else freshly fetched.
    pub async fn topic(&self, name: &str) -> Result<TopicMetadata> {
        if let Some(t) = self.metadata().topic(name) {
            return Ok(t.clone());
        }
        let md = self.refresh(Some(&[name.to_string()])).await?;
        md.topic(name).cloned().ok_or_else(|| ClientError::UnknownTopic(name.to_string()))
    }

    /// The connection to the shard owning `topic`/`partition`.
    pub async fn leader(&self, topic: &str, partition: u32) -> Result<Connection> {
        let addr = match self.metadata().leader_addr(topic, partition) {
            Ok(a) => a,
            Err(_) => self.refresh(Some(&[topic.to_string()])).await?.leader_addr(topic, partition)?,
        };
        self.connection(&addr).await
    }

    /// ListOffsets, each query sent to the owning shard; requests to
    /// different shards go out concurrently. Answers come back in query order.
    pub async fn list_offsets(self: &Arc<Self>, queries: &[OffsetQuery]) -> Result<Vec<OffsetAnswer>> {
        let md = self.metadata();
        let mut by_addr: HashMap<String, Vec<usize>> = HashMap::new();
        for (i, q) in queries.iter().enumerate() {
            let addr = match md.leader_addr(&q.topic, q.partition) {
                Ok(a) => a,
                Err(_) => self
                    .refresh(Some(std::slice::from_ref(&q.topic)))
                    .await?
                    .leader_addr(&q.topic, q.partition)?,
            };
            by_addr.entry(addr).or_default().push(i);
        }
        let mut tasks = tokio::task::JoinSet::new();
        for (addr, indices) in by_addr {
            let cluster = self.clone();
            let qs: Vec<OffsetQuery> = indices.iter().map(|&i| queries[i].clone()).collect();
            tasks.spawn(async move {
                let conn = cluster.connection(&addr).await?;
                let client_id = &cluster.config.client_id;
                let raw =
                    conn.call(|corr| protocol::encode_list_offsets(corr, client_id, &qs), Vec::new()).await?;
                Ok::<_, ClientError>((indices, qs, protocol::decode_list_offsets(&raw)?))
            });
        }
        let mut answers: Vec<Option<OffsetAnswer>> = vec![None; queries.len()];
        while let Some(joined) = tasks.join_next().await {
            let (indices, qs, got) =
                joined.map_err(|e| ClientError::Protocol(format!("list offsets task failed: {e}")))??;
            // Answers normally come in request order; otherwise match each
            // query to the first unused answer for its partition.
            let mut got: Vec<Option<OffsetAnswer>> = got.into_iter().map(Some).collect();
            for (i, q) in indices.into_iter().zip(&qs) {
                let slot = got
                    .iter_mut()
                    .find(|a| a.as_ref().is_some_and(|a| a.topic == q.topic && a.partition == q.partition));
                answers[i] = slot.and_then(Option::take);
            }
        }
        answers
            .into_iter()
            .map(|a| a.ok_or_else(|| ClientError::Protocol("missing ListOffsets answer".into())))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::parse_bootstrap;

    #[test]
    fn bootstrap_lists() {
        assert_eq!(parse_bootstrap("a:1").unwrap(), vec!["a:1"]);
        assert_eq!(parse_bootstrap(" a:1, b:2 ,").unwrap(), vec!["a:1", "b:2"]);
        for bad in ["", " , ", "a", "a:x", ":1", "a:1,b"] {
            assert!(parse_bootstrap(bad).is_err(), "{bad}");
        }
    }
}
