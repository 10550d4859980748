//! An in-memory broker speaking the wire protocol, for the client's unit
//! tests: one "shard" on one port, partitions kept as stamped batch bytes.

use bytes::Bytes;
use flatbuffers::{FlatBufferBuilder, UnionWIPOffset, WIPOffset};
use shardlog_schema::batch::{self, BatchIter};
use shardlog_schema::frame::{finish_into, FrameLimits};
use shardlog_schema::{wire, ErrorCode};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

#[derive(Default)]
pub struct MockState {
    pub topics: BTreeMap<String, Vec<PartitionLog>>,
    pub configs: BTreeMap<String, Vec<(String, String)>>,
    pub produce_requests: usize,
    pub produce_acks: Vec<i8>,
    /// Answer the next produce partitions with this error (then clear it).
    pub fail_next_produce: Vec<ErrorCode>,
    /// Gather this many responses per connection, then send them in reverse.
    pub reverse_batch: usize,
    /// Accept produce requests but never answer them.
    pub stall_produce: bool,
}

#[derive(Default, Clone)]
pub struct PartitionLog {
    pub bytes: Vec<u8>,
    pub next_offset: u64,
}

pub struct MockBroker {
    pub addr: String,
    pub state: Arc<Mutex<MockState>>,
}

impl MockBroker {
    pub async fn start() -> MockBroker {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr").to_string();
        let state = Arc::new(Mutex::new(MockState::default()));
        let port = listener.local_addr().expect("addr").port();
        let st = state.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(serve(stream, st.clone(), port));
            }
        });
        MockBroker { addr, state }
    }

    pub fn create(&self, topic: &str, partitions: u32) {
        let mut st = self.state.lock().expect("lock");
        st.topics.insert(topic.to_string(), vec![PartitionLog::default(); partitions as usize]);
    }

    pub fn with<R>(&self, f: impl FnOnce(&mut MockState) -> R) -> R {
        f(&mut self.state.lock().expect("lock"))
    }
}

async fn serve(mut stream: TcpStream, state: Arc<Mutex<MockState>>, port: u16) {
    let limits = FrameLimits::default();
    let mut held: Vec<Vec<u8>> = Vec::new();
    loop {
        let mut prefix = [0u8; 4];
        if stream.read_exact(&mut prefix).await.is_err() {
            return;
        }
        let mut header = vec![0u8; u32::from_le_bytes(prefix) as usize];
        if stream.read_exact(&mut header).await.is_err() {
            return;
        }
        let frame = limits.verify_request(&header).expect("client sends valid requests");
        let mut payload = vec![0u8; frame.payload_bytes() as usize];
        if stream.read_exact(&mut payload).await.is_err() {
            return;
        }
        let is_fetch = frame.api_key() == wire::ApiKey::Fetch;
        let (response, body_payload) = {
            let mut st = state.lock().expect("lock");
            handle(&mut st, frame, &payload, port)
        };
        if is_fetch && body_payload.is_empty() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let Some(mut out) = response else { continue };
        out.extend_from_slice(&body_payload);
        let reverse = state.lock().expect("lock").reverse_batch;
        held.push(out);
        if held.len() >= reverse.max(1) {
            for r in held.drain(..).rev() {
                if stream.write_all(&r).await.is_err() {
                    return;
                }
            }
        }
    }
}

fn respond(
    mut fbb: FlatBufferBuilder<'_>,
    corr: u32,
    key: wire::ApiKey,
    body_type: wire::ResponseBody,
    body: WIPOffset<UnionWIPOffset>,
    payload_bytes: u32,
) -> Vec<u8> {
    let root = wire::ResponseFrame::create(
        &mut fbb,
        &wire::ResponseFrameArgs {
            correlation_id: corr,
            api_key: key,
            error: ErrorCode::None,
            error_message: None,
            payload_bytes,
            body_type,
            body: Some(body),
        },
    );
    let mut out = Vec::new();
    finish_into(&mut fbb, root, &mut out);
    out
}

fn handle(
    st: &mut MockState,
    frame: wire::RequestFrame<'_>,
    payload: &[u8],
    port: u16,
) -> (Option<Vec<u8>>, Vec<u8>) {
    let corr = frame.correlation_id();
    let mut fbb = FlatBufferBuilder::new();
    match frame.api_key() {
        wire::ApiKey::Metadata => {
            let req = frame.body_as_metadata_request().expect("body");
            let names: Vec<String> = match req.topics() {
                Some(t) if !t.is_empty() => t.iter().map(str::to_string).collect(),
                _ => st.topics.keys().cloned().collect(),
            };
            let host = fbb.create_string("127.0.0.1");
            let shard = wire::ShardEndpoint::create(&mut fbb, &wire::ShardEndpointArgs { shard: 0, port });
            let shards = fbb.create_vector(&[shard]);
            let broker = wire::BrokerMetadata::create(
                &mut fbb,
                &wire::BrokerMetadataArgs { broker_id: 0, host: Some(host), port, shards: Some(shards) },
            );
            let brokers = fbb.create_vector(&[broker]);
            let topics: Vec<_> = names
                .iter()
                .map(|n| {
                    let count = st.topics.get(n).map(Vec::len);
                    let parts: Vec<_> = (0..count.unwrap_or(0) as u32)
                        .map(|p| {
                            wire::PartitionMetadata::create(
                                &mut fbb,
                                &wire::PartitionMetadataArgs {
                                    partition: p,
                                    leader_port: port,
                                    ..Default::default()
                                },
                            )
                        })
                        .collect();
                    let parts = fbb.create_vector(&parts);
                    let name = fbb.create_string(n);
                    let error =
                        if count.is_some() { ErrorCode::None } else { ErrorCode::UnknownTopicOrPartition };
                    let entries = st.configs.get(n).cloned().unwrap_or_default();
                    let configs: Vec<_> = entries
                        .iter()
                        .map(|(k, v)| {
                            let (k, v) = (fbb.create_string(k), fbb.create_string(v));
                            wire::ConfigEntry::create(
                                &mut fbb,
                                &wire::ConfigEntryArgs { name: Some(k), value: Some(v) },
                            )
                        })
                        .collect();
                    let configs = fbb.create_vector(&configs);
                    wire::TopicMetadata::create(
                        &mut fbb,
                        &wire::TopicMetadataArgs {
                            name: Some(name),
                            error,
                            partitions: Some(parts),
                            configs: Some(configs),
                        },
                    )
                })
                .collect();
            let topics = fbb.create_vector(&topics);
            let body = wire::MetadataResponse::create(
                &mut fbb,
                &wire::MetadataResponseArgs {
                    brokers: Some(brokers),
                    controller_id: 0,
                    topics: Some(topics),
                },
            );
            let r = respond(
                fbb,
                corr,
                frame.api_key(),
                wire::ResponseBody::MetadataResponse,
                body.as_union_value(),
                0,
            );
            (Some(r), Vec::new())
        }
        wire::ApiKey::CreateTopics => {
            let req = frame.body_as_create_topics_request().expect("body");
            let results: Vec<_> = req
                .topics()
                .expect("topics")
                .iter()
                .map(|t| {
                    let name = t.name().expect("name").to_string();
                    let error = if st.topics.contains_key(&name) {
                        ErrorCode::TopicAlreadyExists
                    } else {
                        st.topics
                            .insert(name.clone(), vec![PartitionLog::default(); t.partitions() as usize]);
                        let configs = t
                            .configs()
                            .map(|cs| {
                                cs.iter()
                                    .map(|c| {
                                        (
                                            c.name().unwrap_or("").to_string(),
                                            c.value().unwrap_or("").to_string(),
                                        )
                                    })
                                    .collect()
                            })
                            .unwrap_or_default();
                        st.configs.insert(name.clone(), configs);
                        ErrorCode::None
                    };
                    let name = fbb.create_string(&name);
                    wire::TopicResult::create(
                        &mut fbb,
                        &wire::TopicResultArgs { name: Some(name), error, message: None },
                    )
                })
                .collect();
            let results = fbb.create_vector(&results);
            let body = wire::CreateTopicsResponse::create(
                &mut fbb,
                &wire::CreateTopicsResponseArgs { results: Some(results) },
            );
            let r = respond(
                fbb,
                corr,
                frame.api_key(),
                wire::ResponseBody::CreateTopicsResponse,
                body.as_union_value(),
                0,
            );
            (Some(r), Vec::new())
        }
        wire::ApiKey::DeleteTopics => {
            let req = frame.body_as_delete_topics_request().expect("body");
            let results: Vec<_> = req
                .topics()
                .expect("topics")
                .iter()
                .map(|name| {
                    let error = match st.topics.remove(name) {
                        Some(_) => ErrorCode::None,
                        None => ErrorCode::UnknownTopicOrPartition,
                    };
                    let name = fbb.create_string(name);
                    wire::TopicResult::create(
                        &mut fbb,
                        &wire::TopicResultArgs { name: Some(name), error, message: None },
                    )
                })
                .collect();
            let results = fbb.create_vector(&results);
            let body = wire::DeleteTopicsResponse::create(
                &mut fbb,
                &wire::DeleteTopicsResponseArgs { results: Some(results) },
            );
            let r = respond(
                fbb,
                corr,
                frame.api_key(),
                wire::ResponseBody::DeleteTopicsResponse,
                body.as_union_value(),
                0,
            );
            (Some(r), Vec::new())
        }
        wire::ApiKey::Produce => {
            let req = frame.body_as_produce_request().expect("body");
            st.produce_requests += 1;
            st.produce_acks.push(req.acks());
            let mut at = 0usize;
            let mut results = Vec::new();
            for p in req.partitions().expect("partitions") {
                let len = p.batch_bytes() as usize;
                let data = &payload[at..at + len];
                at += len;
                let topic = p.topic().expect("topic").to_string();
                let injected =
                    if st.fail_next_produce.is_empty() { None } else { Some(st.fail_next_produce.remove(0)) };
                let (error, base) = match (injected, st.topics.get_mut(&topic)) {
                    (Some(e), _) => (e, -1),
                    (None, Some(parts)) => {
                        let log = &mut parts[p.partition() as usize];
                        let base = log.next_offset as i64;
                        for b in BatchIter::new(data, 1 << 30) {
                            let (h, bytes) = b.expect("valid batch");
                            batch::validate_with_records(bytes, 1 << 30).expect("valid records");
                            let mut stamped = bytes.to_vec();
                            batch::stamp(&mut stamped, log.next_offset, 0);
                            log.next_offset += u64::from(h.record_count);
                            log.bytes.extend_from_slice(&stamped);
                        }
                        (ErrorCode::None, base)
                    }
                    (None, None) => (ErrorCode::UnknownTopicOrPartition, -1),
                };
                let topic = fbb.create_string(&topic);
                results.push(wire::ProducePartitionResponse::create(
                    &mut fbb,
                    &wire::ProducePartitionResponseArgs {
                        topic: Some(topic),
                        partition: p.partition(),
                        error,
                        base_offset: base,
                        ..Default::default()
                    },
                ));
            }
            if req.acks() == 0 || st.stall_produce {
                return (None, Vec::new());
            }
            let results = fbb.create_vector(&results);
            let body = wire::ProduceResponse::create(
                &mut fbb,
                &wire::ProduceResponseArgs { partitions: Some(results) },
            );
            let r = respond(
                fbb,
                corr,
                frame.api_key(),
                wire::ResponseBody::ProduceResponse,
                body.as_union_value(),
                0,
            );
            (Some(r), Vec::new())
        }
        wire::ApiKey::Fetch => {
            let req = frame.body_as_fetch_request().expect("body");
            let mut out_payload = Vec::new();
            let mut parts = Vec::new();
            for p in req.partitions().expect("partitions") {
                let topic = p.topic().expect("topic").to_string();
                let log =
                    st.topics.get(&topic).map(|ps| ps[p.partition() as usize].clone()).unwrap_or_default();
                let start = out_payload.len();
                let offset = p.fetch_offset() as u64;
                for b in BatchIter::new(&log.bytes, 1 << 30) {
                    let (h, bytes) = b.expect("stored batches are valid");
                    if h.last_offset() < offset {
                        continue;
                    }
                    if out_payload.len() - start >= p.partition_max_bytes() as usize {
                        break;
                    }
                    out_payload.extend_from_slice(bytes);
                }
                let topic = fbb.create_string(&topic);
                parts.push(wire::FetchPartitionResponse::create(
                    &mut fbb,
                    &wire::FetchPartitionResponseArgs {
                        topic: Some(topic),
                        partition: p.partition(),
                        high_watermark: log.next_offset as i64,
                        bytes: (out_payload.len() - start) as u32,
                        ..Default::default()
                    },
                ));
            }
            let parts = fbb.create_vector(&parts);
            let body =
                wire::FetchResponse::create(&mut fbb, &wire::FetchResponseArgs { partitions: Some(parts) });
            let r = respond(
                fbb,
                corr,
                frame.api_key(),
                wire::ResponseBody::FetchResponse,
                body.as_union_value(),
                out_payload.len() as u32,
            );
            (Some(r), out_payload)
        }
        wire::ApiKey::ListOffsets => {
            let req = frame.body_as_list_offsets_request().expect("body");
            let answers: Vec<_> = req
                .partitions()
                .expect("partitions")
                .iter()
                .map(|q| {
                    let log =
                        st.topics.get(q.topic().expect("topic")).map(|ps| ps[q.partition() as usize].clone());
                    let (error, offset) = match (log, q.timestamp()) {
                        (None, _) => (ErrorCode::UnknownTopicOrPartition, -1),
                        (Some(_), -2) => (ErrorCode::None, 0),
                        (Some(l), -1) => (ErrorCode::None, l.next_offset as i64),
                        (Some(l), ts) => {
                            let found = BatchIter::new(&l.bytes, 1 << 30)
                                .flat_map(|b| {
                                    batch::records(b.expect("valid").1)
                                        .expect("records")
                                        .into_iter()
                                        .map(|r| (r.offset, r.timestamp_ms))
                                        .collect::<Vec<_>>()
                                })
                                .find(|(_, t)| *t >= ts);
                            (ErrorCode::None, found.map_or(-1, |(o, _)| o as i64))
                        }
                    };
                    let topic = fbb.create_string(q.topic().expect("topic"));
                    wire::ListOffsetsPartitionResponse::create(
                        &mut fbb,
                        &wire::ListOffsetsPartitionResponseArgs {
                            topic: Some(topic),
                            partition: q.partition(),
                            error,
                            offset,
                            timestamp: -1,
                        },
                    )
                })
                .collect();
            let answers = fbb.create_vector(&answers);
            let body = wire::ListOffsetsResponse::create(
                &mut fbb,
                &wire::ListOffsetsResponseArgs { partitions: Some(answers) },
            );
            let r = respond(
                fbb,
                corr,
                frame.api_key(),
                wire::ResponseBody::ListOffsetsResponse,
                body.as_union_value(),
                0,
            );
            (Some(r), Vec::new())
        }
        other => panic!("mock broker does not implement {other:?}"),
    }
}

/// Bytes helper for tests.
pub fn b(s: &str) -> Bytes {
    Bytes::copy_from_slice(s.as_bytes())
}
