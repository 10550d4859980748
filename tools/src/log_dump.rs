//! `shardlog log dump`: delegates to the storage engine's segment dumper.

use anyhow::Context;
use std::io::Write;
use std::path::Path;

pub fn run(path: &Path, records: bool) -> anyhow::Result<()> {
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    dump_segment(path, records, &mut out).with_context(|| format!("cannot dump {}", path.display()))?;
    out.flush().context("writing to stdout")?;
    Ok(())
}

/// Stand-in until `shardlog_broker::log::dump::dump_segment` lands: walks
/// the batches of a segment file with the shared batch reader.
fn dump_segment(path: &Path, records: bool, out: &mut dyn Write) -> anyhow::Result<()> {
    use shardlog_schema::batch::{self, BatchIter};
    let bytes = std::fs::read(path)?;
    let mut iter = BatchIter::new(&bytes, usize::MAX);
    let mut count = 0usize;
    while let Some(item) = iter.next() {
        let (h, data) = match item {
            Ok(b) => b,
            Err(e) => {
                writeln!(out, "corrupt batch at position {}: {e}", iter.position())?;
                break;
            }
        };
        count += 1;
        writeln!(
            out,
            "baseOffset: {} lastOffset: {} count: {} position: {} size: {} crc: {:#010x} leaderEpoch: {} firstTimestamp: {} maxTimestamp: {}",
            h.base_offset,
            h.last_offset(),
            h.record_count,
            iter.position() - data.len(),
            data.len(),
            h.crc,
            h.leader_epoch,
            h.first_timestamp,
            h.max_timestamp
        )?;
        if records {
            for r in batch::records(data)? {
                writeln!(
                    out,
                    "| offset: {} timestamp: {} key: {} value: {}",
                    r.offset,
                    r.timestamp_ms,
                    r.key.map_or_else(|| "null".to_string(), |k| String::from_utf8_lossy(k).into_owned()),
                    String::from_utf8_lossy(r.value)
                )?;
            }
        }
    }
    let tail = bytes.len() - iter.position();
    writeln!(out, "batches: {count} bytes: {} trailing: {tail}", bytes.len())?;
    Ok(())
}
