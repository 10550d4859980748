//! Raw-frame helpers for the broker tests that talk to a real broker
//! over sockets (`serve`, `produce_order`): no client crate involved.
#![allow(dead_code, reason = "each test binary uses a different subset")]

use flatbuffers::FlatBufferBuilder;
use shardlog_broker::config::BrokerConfig;
use shardlog_broker::{start, BrokerHandle};
use shardlog_schema::batch::{self, BatchBuilder, BatchIter};
use shardlog_schema::frame::{finish_into, FrameLimits};
use shardlog_schema::wire::{self, ApiKey, ErrorCode};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

pub fn broker(dir: &std::path::Path, shards: usize) -> BrokerHandle {
    let mut config = BrokerConfig::new(dir.to_path_buf(), "127.0.0.1:0".parse().expect("addr"));
    config.shards = shards;
    config.pin_cores = false;
    start(config).expect("broker starts")
}

pub struct Conn {
    pub stream: TcpStream,
    pub next: u32,
    /// While corked, requests are gathered here and sent in one write.
    corked: Option<Vec<u8>>,
}

/// A decoded response: envelope bytes and payload.
pub struct Resp {
    pub header: Vec<u8>,
    pub payload: Vec<u8>,
}

impl Resp {
    pub fn frame(&self) -> wire::ResponseFrame<'_> {
        FrameLimits::default().verify_response(&self.header).expect("response verifies")
    }
}

impl Conn {
    pub fn open(port: u16) -> Conn {
        let stream = TcpStream::connect(("127.0.0.1", port)).expect("connect");
        stream.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
        Conn { stream, next: 1, corked: None }
    }

    pub fn send<'a>(
        &mut self,
        key: ApiKey,
        build: impl FnOnce(
            &mut FlatBufferBuilder<'a>,
        ) -> (wire::RequestBody, flatbuffers::WIPOffset<flatbuffers::UnionWIPOffset>),
        payload: &[u8],
    ) -> u32 {
        let mut fbb = FlatBufferBuilder::new();
        let (body_type, body) = build(&mut fbb);
        let corr = self.next;
        self.next += 1;
        let root = wire::RequestFrame::create(
            &mut fbb,
            &wire::RequestFrameArgs {
                correlation_id: corr,
                api_key: key,
                api_version: 0,
                client_id: None,
                payload_bytes: payload.len() as u32,
                body_type,
                body: Some(body),
            },
        );
        let mut out = Vec::new();
        finish_into(&mut fbb, root, &mut out);
        out.extend_from_slice(payload);
        match &mut self.corked {
            Some(held) => held.extend_from_slice(&out),
            None => self.stream.write_all(&out).expect("write"),
        }
        corr
    }

    /// Holds the requests sent from now on until `uncork`.
    pub fn cork(&mut self) {
        self.corked.get_or_insert_with(Vec::new);
    }

    /// Sends the held requests in one write.
    pub fn uncork(&mut self) {
        if let Some(held) = self.corked.take() {
            self.stream.write_all(&held).expect("write");
        }
    }

    /// A second handle on the same connection (e.g. a writer thread).
    pub fn try_clone(&self) -> Conn {
        Conn { stream: self.stream.try_clone().expect("clone socket"), next: self.next, corked: None }
    }

    pub fn recv(&mut self) -> Resp {
        let mut prefix = [0u8; 4];
        self.stream.read_exact(&mut prefix).expect("read prefix");
        let mut header = vec![0u8; u32::from_le_bytes(prefix) as usize];
        self.stream.read_exact(&mut header).expect("read header");
        let n = FrameLimits::default().verify_response(&header).expect("verifies").payload_bytes();
        let mut payload = vec![0u8; n as usize];
        self.stream.read_exact(&mut payload).expect("read payload");
        Resp { header, payload }
    }

    pub fn create_topic(&mut self, name: &str, partitions: u32) -> ErrorCode {
        self.send(
            ApiKey::CreateTopics,
            |fbb| {
                let n = fbb.create_string(name);
                let t = wire::CreatableTopic::create(
                    fbb,
                    &wire::CreatableTopicArgs {
                        name: Some(n),
                        partitions,
                        replication_factor: 1,
                        configs: None,
                    },
                );
                let ts = fbb.create_vector(&[t]);
                let b = wire::CreateTopicsRequest::create(
                    fbb,
                    &wire::CreateTopicsRequestArgs { topics: Some(ts) },
                );
                (wire::RequestBody::CreateTopicsRequest, b.as_union_value())
            },
            &[],
        );
        let r = self.recv();
        let f = r.frame();
        f.body_as_create_topics_response().expect("create body").results().expect("results").get(0).error()
    }

    pub fn delete_topic(&mut self, name: &str) -> ErrorCode {
        self.send(
            ApiKey::DeleteTopics,
            |fbb| {
                let n = fbb.create_string(name);
                let ts = fbb.create_vector(&[n]);
                let b = wire::DeleteTopicsRequest::create(
                    fbb,
                    &wire::DeleteTopicsRequestArgs { topics: Some(ts) },
                );
                (wire::RequestBody::DeleteTopicsRequest, b.as_union_value())
            },
            &[],
        );
        let r = self.recv();
        let f = r.frame();
        f.body_as_delete_topics_response().expect("delete body").results().expect("results").get(0).error()
    }

    pub fn produce(&mut self, topic: &str, partition: u32, batches: &[u8]) -> (ErrorCode, i64) {
        self.send_produce(&[(topic, partition, batches)]);
        let (_, _, error, base) = self.recv_produce().swap_remove(0);
        (error, base)
    }

    /// Sends one produce request (acks 1) with a part per `(topic,
    /// partition, batches)`, without waiting for the answer.
    pub fn send_produce(&mut self, parts: &[(&str, u32, &[u8])]) -> u32 {
        let payload: Vec<u8> = parts.iter().flat_map(|(_, _, b)| b.iter().copied()).collect();
        self.send(
            ApiKey::Produce,
            |fbb| {
                let ps: Vec<_> = parts
                    .iter()
                    .map(|(topic, partition, batches)| {
                        let t = fbb.create_string(topic);
                        wire::ProducePartitionData::create(
                            fbb,
                            &wire::ProducePartitionDataArgs {
                                topic: Some(t),
                                partition: *partition,
                                batch_bytes: batches.len() as u32,
                            },
                        )
                    })
                    .collect();
                let ps = fbb.create_vector(&ps);
                let b = wire::ProduceRequest::create(
                    fbb,
                    &wire::ProduceRequestArgs { acks: 1, timeout_ms: 30_000, partitions: Some(ps) },
                );
                (wire::RequestBody::ProduceRequest, b.as_union_value())
            },
            &payload,
        )
    }

    /// The next produce answer: (topic, partition, error, base offset) per part.
    pub fn recv_produce(&mut self) -> Vec<(String, u32, ErrorCode, i64)> {
        let r = self.recv();
        let f = r.frame();
        assert_eq!(f.error(), ErrorCode::None, "{:?}", f.error_message());
        let parts = f.body_as_produce_response().expect("body").partitions().expect("parts");
        parts
            .iter()
            .map(|p| (p.topic().unwrap_or("").to_string(), p.partition(), p.error(), p.base_offset()))
            .collect()
    }

    /// The next produce answer: (error, message) per part.
    pub fn recv_produce_errors(&mut self) -> Vec<(ErrorCode, String)> {
        let r = self.recv();
        let f = r.frame();
        let parts = f.body_as_produce_response().expect("body").partitions().expect("parts");
        parts.iter().map(|p| (p.error(), p.error_message().unwrap_or("").to_string())).collect()
    }

    pub fn fetch(
        &mut self,
        topic: &str,
        partition: u32,
        offset: i64,
        max_wait_ms: u32,
    ) -> (ErrorCode, Vec<u8>, i64) {
        self.send_fetch(topic, &[partition], offset, max_wait_ms, 4 << 20);
        let r = self.recv();
        let f = r.frame();
        let p = f.body_as_fetch_response().expect("body").partitions().expect("parts").get(0);
        assert_eq!(p.bytes() as usize, r.payload.len());
        (p.error(), r.payload.clone(), p.high_watermark())
    }

    /// One fetch of many partitions of `topic` from `offset` each (1 MiB per
    /// partition, 8 MiB in all): each partition's error and data.
    pub fn fetch_many(
        &mut self,
        topic: &str,
        partitions: &[u32],
        offset: i64,
    ) -> Vec<(u32, ErrorCode, Vec<u8>)> {
        self.send_fetch(topic, partitions, offset, 0, 8 << 20);
        let r = self.recv();
        let f = r.frame();
        let mut at = 0;
        let parts = f.body_as_fetch_response().expect("body").partitions().expect("parts");
        let out = parts
            .iter()
            .map(|p| {
                let data = r.payload[at..at + p.bytes() as usize].to_vec();
                at += data.len();
                (p.partition(), p.error(), data)
            })
            .collect();
        assert_eq!(at, r.payload.len(), "the partitions' bytes make up the payload");
        out
    }

    /// Sends a fetch of `partitions` of `topic` from `offset` each, 1 MiB
    /// per partition and `max_bytes` in all.
    fn send_fetch(&mut self, topic: &str, partitions: &[u32], offset: i64, max_wait_ms: u32, max_bytes: u32) {
        self.send(
            ApiKey::Fetch,
            |fbb| {
                let t = fbb.create_string(topic);
                let ps: Vec<_> = partitions
                    .iter()
                    .map(|&partition| {
                        wire::FetchPartition::create(
                            fbb,
                            &wire::FetchPartitionArgs {
                                topic: Some(t),
                                partition,
                                fetch_offset: offset,
                                partition_max_bytes: 1 << 20,
                                current_leader_epoch: -1,
                                replica_log_end: -1,
                            },
                        )
                    })
                    .collect();
                let ps = fbb.create_vector(&ps);
                let b = wire::FetchRequest::create(
                    fbb,
                    &wire::FetchRequestArgs {
                        replica_id: -1,
                        max_wait_ms,
                        min_bytes: 1,
                        max_bytes,
                        partitions: Some(ps),
                    },
                );
                (wire::RequestBody::FetchRequest, b.as_union_value())
            },
            &[],
        );
    }
}

pub fn values(batches: &[u8]) -> Vec<(u64, Vec<u8>)> {
    let mut out = Vec::new();
    for b in BatchIter::new(batches, 1 << 24) {
        let (_, bytes) = b.expect("valid batch");
        for r in batch::records(bytes).expect("records") {
            out.push((r.offset, r.value.to_vec()));
        }
    }
    out
}

pub fn batch_of(values: &[&str]) -> Vec<u8> {
    let mut b = BatchBuilder::with_capacity(256);
    for v in values {
        b.push(None, v.as_bytes(), &[], 1_700_000_000_000);
    }
    b.finish()
}
