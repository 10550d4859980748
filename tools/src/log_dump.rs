//! `shardlog log dump`: prints a segment file through the storage engine's
//! dumper. Exits non-zero when the file is damaged (after printing what is
//! readable), so scripts can check segments.

use anyhow::{bail, Context};
use std::io::Write;
use std::path::Path;

pub fn run(path: &Path, records: bool) -> anyhow::Result<()> {
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let summary = shardlog_broker::log::dump::dump_segment(path, records, &mut out)
        .with_context(|| format!("cannot dump {}", path.display()))?;
    out.flush().context("writing to stdout")?;
    if let Some((position, reason)) = summary.broken_at {
        bail!("{} is damaged at byte {position}: {reason}", path.display());
    }
    Ok(())
}
