//! Quick closed-loop producer throughput check (the real harness is in
//! `bench/`): `cargo run --release -p shardlog-client --example produce_rate --
//! HOST:PORT TOPIC COUNT VALUE_BYTES`. The topic must exist.

use shardlog_client::{ClientConfig, Producer, ProducerConfig, ProducerRecord};
use std::time::Instant;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let [_, bootstrap, topic, count, size] = &args[..] else {
        return Err("usage: produce_rate HOST:PORT TOPIC COUNT VALUE_BYTES".into());
    };
    let count: u64 = count.parse()?;
    let value = bytes::Bytes::from(vec![b'x'; size.parse()?]);
    let producer =
        Producer::new(ProducerConfig { client: ClientConfig::new(bootstrap.clone()), ..Default::default() })
            .await?;
    let start = Instant::now();
    let mut last = None;
    for _ in 0..count {
        last =
            Some(producer.send(ProducerRecord::new(topic.clone(), value.clone()).with_partition(0)).await?);
    }
    producer.flush().await?;
    if let Some(last) = last {
        last.await?;
    }
    let secs = start.elapsed().as_secs_f64();
    println!(
        "{count} messages of {} B in {secs:.2} s: {:.0} msg/s, {:.1} MB/s",
        value.len(),
        count as f64 / secs,
        count as f64 * value.len() as f64 / secs / 1e6
    );
    Ok(())
}
