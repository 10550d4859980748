//! The client commands: topic, produce, consume.

use crate::settings::Settings;
use crate::{
    AcksArg, ClientArgs, ConfigFileArg, ConsumeArgs, Format, OffsetResetArg, OutputFormat, ProduceArgs,
    TopicCommand,
};
use anyhow::{bail, Context};
use base64::Engine as _;
use bytes::Bytes;
use shardlog_client::{
    Acks, Admin, ClientConfig, Consumer, ConsumerConfig, ConsumerRecord, DeliveryFuture, OffsetReset,
    Producer, ProducerConfig, ProducerRecord, SeekTo,
};
use std::io::Write;
use std::time::Duration;
use tokio::io::AsyncBufReadExt;

const BOOTSTRAP_DEFAULT: &str = "127.0.0.1:9092";
/// Deliveries awaited behind the stdin reader before it waits.
const DELIVERIES_QUEUED_MAX: usize = 100_000;

pub fn block_on(fut: impl std::future::Future<Output = anyhow::Result<()>>) -> anyhow::Result<()> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the async runtime")?
        .block_on(fut)
}

/// Client settings: flags and env (already merged by clap) over the file over defaults.
pub(crate) fn client_config(
    args: &ClientArgs,
    file_arg: Option<&ConfigFileArg>,
) -> anyhow::Result<(ClientConfig, Settings)> {
    let path = file_arg.and_then(|f| f.config.clone()).or_else(|| args.config_file.clone());
    let settings = Settings::load(path.as_deref())?;
    let mut config = ClientConfig::new(
        args.bootstrap
            .clone()
            .or_else(|| settings.bootstrap.clone())
            .unwrap_or_else(|| BOOTSTRAP_DEFAULT.into()),
    );
    config.client_id = args
        .client_id
        .clone()
        .or_else(|| settings.client_id.clone())
        .unwrap_or_else(|| "shardlog-cli".into());
    if let Some(ms) = args.request_timeout_ms.or(settings.request_timeout_ms) {
        config.request_timeout_ms = ms;
    }
    Ok((config, settings))
}

pub(crate) async fn admin(config: ClientConfig) -> anyhow::Result<Admin> {
    let bootstrap = config.bootstrap.clone();
    Admin::connect(config).await.with_context(|| format!("cannot connect to {bootstrap}"))
}

pub async fn topic(cmd: TopicCommand) -> anyhow::Result<()> {
    match cmd {
        TopicCommand::Create { name, partitions, replication_factor, configs, client } => {
            let entries =
                configs.iter().map(|kv| crate::serve::parse_kv(kv)).collect::<anyhow::Result<Vec<_>>>()?;
            let (config, _) = client_config(&client, None)?;
            admin(config)
                .await?
                .create_topic_replicated(&name, partitions, replication_factor, &entries)
                .await
                .with_context(|| format!("cannot create topic `{name}`"))?;
            println!("created topic {name} with {partitions} partitions");
        }
        TopicCommand::List { output, include_internal, client, file } => {
            let (config, _) = client_config(&client, Some(&file))?;
            let admin = admin(config).await?;
            let names =
                if include_internal { admin.list_all_topics().await } else { admin.list_topics().await }
                    .context("cannot list topics")?;
            match output {
                OutputFormat::Json => println!("{}", serde_json::Value::from(names)),
                OutputFormat::Text => {
                    for name in names {
                        println!("{name}");
                    }
                }
            }
        }
        TopicCommand::Describe { name, output, client, file } => {
            let (config, _) = client_config(&client, Some(&file))?;
            let d = admin(config)
                .await?
                .describe_topic(&name)
                .await
                .with_context(|| format!("cannot describe `{name}`"))?;
            if output == OutputFormat::Json {
                println!("{}", describe_json(&d));
                return Ok(());
            }
            println!("topic: {}  partitions: {}", d.name, d.partitions.len());
            for (k, v) in &d.configs {
                println!("  {k}={v}");
            }
            println!(
                "{:>9} {:>6} {:>5} {:>21} {:>12} {:>12} {:>8} {:>8} {:>6}",
                "partition", "leader", "shard", "address", "start", "end", "replicas", "isr", "epoch"
            );
            let ids = |v: &[i32]| v.iter().map(i32::to_string).collect::<Vec<_>>().join(",");
            for p in &d.partitions {
                let (replicas, isr) = (ids(&p.replicas), ids(&p.isr));
                // Under-replicated: some replica is out of sync.
                let mark = if p.isr.len() < p.replicas.len() { " UNDER-REPLICATED" } else { "" };
                if p.offline {
                    println!(
                        "{:>9} {:>6} {:>5} {:>21} {:>12} {:>12} {:>8} {:>8} {:>6}",
                        p.partition,
                        "-",
                        "-",
                        "OFFLINE (no live leader)",
                        "-",
                        "-",
                        replicas,
                        isr,
                        p.leader_epoch
                    );
                    continue;
                }
                let addr = format!("{}:{}", p.leader_host, p.leader_port);
                println!(
                    "{:>9} {:>6} {:>5} {:>21} {:>12} {:>12} {:>8} {:>8} {:>6}{mark}",
                    p.partition,
                    p.leader_broker,
                    p.leader_shard,
                    addr,
                    p.start_offset,
                    p.end_offset,
                    replicas,
                    isr,
                    p.leader_epoch
                );
            }
        }
        TopicCommand::Delete { name, client, file } => {
            let (config, _) = client_config(&client, Some(&file))?;
            admin(config)
                .await?
                .delete_topic(&name)
                .await
                .with_context(|| format!("cannot delete topic `{name}`"))?;
            println!("deleted topic {name}");
        }
    }
    Ok(())
}

fn acks(arg: Option<AcksArg>, file: Option<&str>) -> anyhow::Result<Acks> {
    Ok(match (arg, file) {
        (Some(AcksArg::None), _) => Acks::None,
        (Some(AcksArg::Leader), _) => Acks::Leader,
        (Some(AcksArg::All), _) => Acks::All,
        (None, None) => Acks::Leader,
        (None, Some("0" | "none")) => Acks::None,
        (None, Some("1" | "leader")) => Acks::Leader,
        (None, Some("all" | "-1")) => Acks::All,
        (None, Some(other)) => bail!("invalid acks `{other}` in config file: expected 0, 1 or all"),
    })
}

pub async fn produce(args: ProduceArgs) -> anyhow::Result<()> {
    let (client, settings) = client_config(&args.client, Some(&args.file))?;
    let p = &settings.producer;
    let defaults = ProducerConfig::default();
    let config = ProducerConfig {
        client: client.clone(),
        acks: acks(args.acks, p.acks.as_deref())?,
        linger_ms: args.linger_ms.or(p.linger_ms).unwrap_or(defaults.linger_ms),
        batch_bytes: args.batch_bytes.or(p.batch_bytes).unwrap_or(defaults.batch_bytes),
        buffer_bytes_max: p.buffer_bytes_max.unwrap_or(defaults.buffer_bytes_max),
        max_in_flight: p.max_in_flight.unwrap_or(defaults.max_in_flight),
        retries: p.retries.unwrap_or(defaults.retries),
        delivery_timeout_ms: p.delivery_timeout_ms.unwrap_or(defaults.delivery_timeout_ms),
        enable_idempotence: match (args.enable_idempotence, args.no_idempotence) {
            (true, _) => true,
            (_, true) => false,
            _ => p.enable_idempotence.unwrap_or(defaults.enable_idempotence),
        },
        ..defaults
    };
    let producer =
        Producer::new(config).await.with_context(|| format!("cannot connect to {}", client.bootstrap))?;

    // Deliveries are checked in order by a second task while stdin is read.
    let (tx, mut rx) = tokio::sync::mpsc::channel::<(u64, DeliveryFuture)>(DELIVERIES_QUEUED_MAX);
    let checker = tokio::spawn(async move {
        let mut acked = 0u64;
        while let Some((line, delivery)) = rx.recv().await {
            delivery.await.with_context(|| format!("message from line {line} was not delivered"))?;
            acked += 1;
        }
        anyhow::Ok(acked)
    });

    // Keys and values are bytes: stdin is read as bytes and split on b'\n'
    // (and the key separator) as bytes, never decoded as text.
    let mut stdin = tokio::io::BufReader::new(tokio::io::stdin());
    let mut line = Vec::new();
    let mut line_no = 0u64;
    let read_result: anyhow::Result<()> = async {
        loop {
            line.clear();
            if stdin.read_until(b'\n', &mut line).await.context("reading stdin")? == 0 {
                return Ok(());
            }
            line_no += 1;
            if line.last() == Some(&b'\n') {
                line.pop();
            }
            let mut record = match &args.key_separator {
                Some(sep) => {
                    let Some((k, v)) = split_once_bytes(&line, sep.as_bytes()) else {
                        bail!("line {line_no} has no key separator `{sep}`");
                    };
                    ProducerRecord::new(args.topic.clone(), Bytes::copy_from_slice(v))
                        .with_key(Bytes::copy_from_slice(k))
                }
                None => ProducerRecord::new(args.topic.clone(), Bytes::copy_from_slice(&line)),
            };
            record.partition = args.partition;
            let delivery =
                producer.send(record).await.with_context(|| format!("cannot send line {line_no}"))?;
            if tx.send((line_no, delivery)).await.is_err() {
                return Ok(()); // the checker stopped on an error; it reports it
            }
        }
    }
    .await;
    drop(tx);
    let flushed = producer.flush().await;
    let checked = checker.await.context("delivery checker failed")?;
    read_result?;
    let acked = checked?;
    flushed.context("flush failed")?;
    tracing::info!(acked, "all messages acknowledged");
    Ok(())
}

/// Splits `line` at the first occurrence of `sep` (an empty separator never matches).
fn split_once_bytes<'a>(line: &'a [u8], sep: &[u8]) -> Option<(&'a [u8], &'a [u8])> {
    if sep.is_empty() {
        return None;
    }
    let at = line.windows(sep.len()).position(|w| w == sep)?;
    Some((&line[..at], &line[at + sep.len()..]))
}

/// Puts `bytes` into `obj` unambiguously: as the string `name` when they are
/// UTF-8, else base64 (standard alphabet, padded) as `name_base64`.
fn put_bytes(obj: &mut serde_json::Map<String, serde_json::Value>, name: &str, bytes: &[u8]) {
    match std::str::from_utf8(bytes) {
        Ok(text) => obj.insert(name.to_string(), text.into()),
        Err(_) => obj
            .insert(format!("{name}_base64"), base64::engine::general_purpose::STANDARD.encode(bytes).into()),
    };
}

/// One record as a JSON object (documented in `consume --help` and README).
fn record_json(r: &ConsumerRecord) -> serde_json::Value {
    let mut obj = serde_json::Map::new();
    obj.insert("topic".into(), (*r.topic).into());
    obj.insert("partition".into(), r.partition.into());
    obj.insert("offset".into(), r.offset.into());
    obj.insert("timestamp_ms".into(), r.timestamp_ms.into());
    match &r.key {
        Some(k) => put_bytes(&mut obj, "key", k),
        None => {
            obj.insert("key".into(), serde_json::Value::Null);
        }
    }
    put_bytes(&mut obj, "value", &r.value);
    let (mut text, mut encoded) = (serde_json::Map::new(), serde_json::Map::new());
    for (k, v) in &r.headers {
        match std::str::from_utf8(v) {
            Ok(t) => text.insert(k.clone(), t.into()),
            Err(_) => encoded.insert(k.clone(), base64::engine::general_purpose::STANDARD.encode(v).into()),
        };
    }
    obj.insert("headers".into(), text.into());
    if !encoded.is_empty() {
        obj.insert("headers_base64".into(), encoded.into());
    }
    obj.into()
}

pub(crate) fn write_record(
    out: &mut impl Write,
    r: &ConsumerRecord,
    format: Format,
    sep: &str,
) -> std::io::Result<()> {
    match format {
        Format::Value => {
            out.write_all(&r.value)?;
        }
        Format::KeyValue => {
            out.write_all(r.key.as_deref().unwrap_or(b"null"))?;
            out.write_all(sep.as_bytes())?;
            out.write_all(&r.value)?;
        }
        Format::Json => serde_json::to_writer(&mut *out, &record_json(r))?,
    }
    out.write_all(b"\n")
}

pub async fn consume(args: ConsumeArgs) -> anyhow::Result<()> {
    let (client, settings) = client_config(&args.client, Some(&args.file))?;
    let c = &settings.consumer;
    let defaults = ConsumerConfig::default();
    let config = ConsumerConfig {
        client: client.clone(),
        fetch_max_wait_ms: c.fetch_max_wait_ms.unwrap_or(defaults.fetch_max_wait_ms),
        fetch_min_bytes: c.fetch_min_bytes.unwrap_or(defaults.fetch_min_bytes),
        fetch_max_bytes: c.fetch_max_bytes.unwrap_or(defaults.fetch_max_bytes),
        partition_max_bytes: c.partition_max_bytes.unwrap_or(defaults.partition_max_bytes),
        offset_reset: match args.offset_reset {
            OffsetResetArg::Earliest => OffsetReset::Earliest,
            OffsetResetArg::Latest => OffsetReset::Latest,
            OffsetResetArg::None => OffsetReset::Error,
        },
        group: None,
    };
    if let Some(group) = args.group.clone() {
        return crate::group_cmds::consume_in_group(args, config, group).await;
    }
    let partitions: Vec<(String, u32)> = match args.partition {
        Some(p) => vec![(args.topic.clone(), p)],
        None => {
            let admin = admin(client.clone()).await?;
            let md = admin
                .metadata(Some(std::slice::from_ref(&args.topic)))
                .await
                .context("cannot load metadata")?;
            let t = md.topic(&args.topic).with_context(|| format!("unknown topic `{}`", args.topic))?;
            t.partitions.iter().map(|p| (args.topic.clone(), p.partition)).collect()
        }
    };
    let start = match (args.from_beginning, args.offset) {
        (true, _) => SeekTo::Earliest,
        (false, Some(o)) => SeekTo::Offset(o),
        (false, None) => SeekTo::Latest,
    };
    let mut consumer =
        Consumer::new(config).await.with_context(|| format!("cannot connect to {}", client.bootstrap))?;
    consumer.assign(&partitions, start).await.with_context(|| format!("cannot assign `{}`", args.topic))?;

    let max = args.max_messages.unwrap_or(u64::MAX);
    let idle = args.idle_timeout_ms.map(Duration::from_millis);
    let mut printed = 0u64;
    let mut idle_since = tokio::time::Instant::now();
    let stdout = std::io::stdout();
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    while printed < max {
        let records = tokio::select! {
            r = consumer.poll(Duration::from_millis(500)) => r.context("poll failed")?,
            _ = &mut ctrl_c => break,
        };
        for r in consumer.take_resets() {
            eprintln!(
                "warning: offset {} is out of range for {}/{} (readable offsets {} up to {}); \
                 --offset-reset {} moved it to offset {}",
                r.from,
                r.topic,
                r.partition,
                r.log_start,
                r.high_watermark,
                if r.policy == OffsetReset::Earliest { "earliest" } else { "latest" },
                r.to
            );
        }
        if records.is_empty() {
            if idle.is_some_and(|d| idle_since.elapsed() >= d) {
                break;
            }
            continue;
        }
        idle_since = tokio::time::Instant::now();
        let mut out = std::io::BufWriter::new(stdout.lock());
        for r in &records {
            if printed >= max {
                break;
            }
            if let Err(e) = write_record(&mut out, r, args.format, &args.key_separator) {
                return broken_pipe_is_fine(e);
            }
            printed += 1;
        }
        if let Err(e) = out.flush() {
            return broken_pipe_is_fine(e);
        }
    }
    Ok(())
}

/// `consume | head` closing the pipe is a normal way to stop.
pub(crate) fn broken_pipe_is_fine(e: std::io::Error) -> anyhow::Result<()> {
    if e.kind() == std::io::ErrorKind::BrokenPipe {
        return Ok(());
    }
    Err(e).context("writing to stdout")
}

/// `topic describe --output json`: the fields of the text form, by name.
fn describe_json(d: &shardlog_client::TopicDescription) -> serde_json::Value {
    let partitions: Vec<serde_json::Value> = d
        .partitions
        .iter()
        .map(|p| {
            serde_json::json!({
                "partition": p.partition,
                "leader_broker": p.leader_broker,
                "leader_shard": p.leader_shard,
                "leader_host": p.leader_host,
                "leader_port": p.leader_port,
                "leader_epoch": p.leader_epoch,
                "start_offset": p.start_offset,
                "end_offset": p.end_offset,
                "offline": p.offline,
                "replicas": p.replicas,
                "isr": p.isr,
            })
        })
        .collect();
    let configs: serde_json::Map<String, serde_json::Value> =
        d.configs.iter().map(|(k, v)| (k.clone(), serde_json::Value::from(v.as_str()))).collect();
    serde_json::json!({ "name": d.name, "partitions": partitions, "configs": configs })
}
