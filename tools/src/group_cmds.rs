//! `shardlog group ...` and `shardlog consume --group`: consumer groups from
//! the command line.

use std::collections::BTreeMap;
use std::io::Write;
use std::time::Duration;

use anyhow::{bail, Context};
use shardlog_client::group::assignor::decode_assignment;
use shardlog_client::group::wire::GroupDescription;
use shardlog_client::{Admin, Consumer, ConsumerConfig, GroupSettings, OffsetReset};
use tokio::signal::unix::{signal, SignalKind};

use crate::client_cmds::{admin, broken_pipe_is_fine, client_config, write_record};
use crate::{ConsumeArgs, GroupCommand, OutputFormat};

/// How often `consume --group` commits what it printed.
const COMMIT_INTERVAL: Duration = Duration::from_secs(1);

pub async fn group(cmd: GroupCommand) -> anyhow::Result<()> {
    match cmd {
        GroupCommand::List { output, client, file } => {
            let (config, _) = client_config(&client, Some(&file))?;
            let groups = admin(config).await?.list_groups().await.context("cannot list groups")?;
            match output {
                OutputFormat::Json => {
                    let v: Vec<serde_json::Value> = groups
                        .iter()
                        .map(|g| {
                            serde_json::json!({
                                "group": g.group_id, "state": g.state, "protocol_type": g.protocol_type,
                            })
                        })
                        .collect();
                    println!("{}", serde_json::Value::from(v));
                }
                OutputFormat::Text => {
                    for g in groups {
                        println!("{}\t{}", g.group_id, g.state);
                    }
                }
            }
        }
        GroupCommand::Describe { group, output, client, file } => {
            let (config, _) = client_config(&client, Some(&file))?;
            let admin = admin(config).await?;
            let view = describe(&admin, &group).await?;
            match output {
                OutputFormat::Json => println!("{}", view.json()),
                OutputFormat::Text => view.print_text(),
            }
        }
        GroupCommand::ResetOffsets {
            group,
            topic,
            to_earliest,
            to_latest,
            to_offset,
            to_datetime,
            client,
            file,
        } => {
            let (config, _) = client_config(&client, Some(&file))?;
            let admin = admin(config).await?;
            let d =
                admin.describe_group(&group).await.with_context(|| format!("cannot describe `{group}`"))?;
            if !d.members.is_empty() {
                bail!(
                    "group `{group}` has {} active member(s) (state {}): stop its consumers before resetting \
                     its offsets",
                    d.members.len(),
                    d.state
                );
            }
            let t =
                admin.describe_topic(&topic).await.with_context(|| format!("cannot describe `{topic}`"))?;
            let targets: Vec<(String, u32, u64)> = if let Some(when) = to_datetime {
                let ms = parse_time_ms(&when)?;
                admin
                    .offsets_for_time(&topic, ms)
                    .await
                    .context("cannot look up offsets by time")?
                    .into_iter()
                    .map(|(p, o)| (topic.clone(), p, o))
                    .collect()
            } else {
                t.partitions
                    .iter()
                    .map(|p| {
                        let o = match (to_earliest, to_latest, to_offset) {
                            (true, _, _) => p.start_offset,
                            (_, true, _) => p.end_offset,
                            // An offset outside the log is clamped into it, as Kafka's tool does.
                            (_, _, Some(o)) => o.clamp(p.start_offset, p.end_offset),
                            _ => unreachable!("clap requires one of the --to-* flags"),
                        };
                        (topic.clone(), p.partition, o)
                    })
                    .collect()
            };
            if targets.is_empty() {
                bail!("topic `{topic}` has no partitions");
            }
            admin
                .alter_group_offsets(&group, &targets)
                .await
                .with_context(|| format!("cannot reset the offsets of `{group}`"))?;
            for (t, p, o) in &targets {
                println!("{t}\t{p}\t{o}");
            }
        }
        GroupCommand::Delete { group, client, file } => {
            let (config, _) = client_config(&client, Some(&file))?;
            admin(config)
                .await?
                .delete_group(&group)
                .await
                .with_context(|| format!("cannot delete group `{group}`"))?;
            println!("deleted group `{group}`");
        }
    }
    Ok(())
}

/// One partition's line in `group describe`.
struct PartitionLag {
    topic: String,
    partition: u32,
    committed: Option<u64>,
    log_end: Option<u64>,
    owner: Option<String>,
}

impl PartitionLag {
    fn lag(&self) -> Option<u64> {
        Some(self.log_end?.saturating_sub(self.committed?))
    }
}

struct GroupView {
    desc: GroupDescription,
    partitions: Vec<PartitionLag>,
}

/// The group's description joined with its committed offsets and the
/// owners named by the members' assignments.
async fn describe(admin: &Admin, group: &str) -> anyhow::Result<GroupView> {
    let desc = admin.describe_group(group).await.with_context(|| format!("cannot describe `{group}`"))?;
    let offsets =
        admin.group_offsets(group).await.with_context(|| format!("cannot fetch offsets of `{group}`"))?;
    let mut owners: BTreeMap<(String, u32), String> = BTreeMap::new();
    for m in &desc.members {
        // A member's assignment is opaque to the broker; a group of another
        // protocol type shows no owners rather than failing.
        if let Ok(a) = decode_assignment(&m.assignment) {
            for (t, ps) in a {
                for p in ps {
                    owners.insert((t.clone(), p), m.member_id.clone());
                }
            }
        }
    }
    let mut partitions: BTreeMap<(String, u32), PartitionLag> = BTreeMap::new();
    for o in offsets {
        let key = (o.topic.clone(), o.partition);
        partitions.insert(
            key.clone(),
            PartitionLag {
                topic: o.topic,
                partition: o.partition,
                committed: o.offset,
                log_end: o.log_end_offset,
                owner: owners.remove(&key),
            },
        );
    }
    // Assigned partitions with nothing committed yet.
    for ((topic, partition), owner) in owners {
        partitions.insert(
            (topic.clone(), partition),
            PartitionLag { topic, partition, committed: None, log_end: None, owner: Some(owner) },
        );
    }
    Ok(GroupView { desc, partitions: partitions.into_values().collect() })
}

fn opt(v: Option<u64>) -> String {
    v.map_or_else(|| "-".to_string(), |v| v.to_string())
}

impl GroupView {
    fn print_text(&self) {
        let d = &self.desc;
        println!(
            "group {}  state {}  protocol {}/{}  generation {}  leader {}",
            d.group_id,
            d.state,
            if d.protocol_type.is_empty() { "-" } else { &d.protocol_type },
            if d.protocol.is_empty() { "-" } else { &d.protocol },
            d.generation,
            if d.leader.is_empty() { "-" } else { &d.leader }
        );
        println!("members {}", d.members.len());
        for m in &d.members {
            println!(
                "  {}  instance {}  client {}",
                m.member_id,
                m.instance_id.as_deref().unwrap_or("-"),
                if m.client_id.is_empty() { "-" } else { &m.client_id }
            );
        }
        println!(
            "{:<24} {:>9} {:>12} {:>12} {:>10}  owner",
            "topic", "partition", "committed", "log-end", "lag"
        );
        for p in &self.partitions {
            println!(
                "{:<24} {:>9} {:>12} {:>12} {:>10}  {}",
                p.topic,
                p.partition,
                opt(p.committed),
                opt(p.log_end),
                opt(p.lag()),
                p.owner.as_deref().unwrap_or("-")
            );
        }
    }

    fn json(&self) -> serde_json::Value {
        let d = &self.desc;
        let members: Vec<serde_json::Value> = d
            .members
            .iter()
            .map(|m| {
                let assignment: Vec<serde_json::Value> = decode_assignment(&m.assignment)
                    .unwrap_or_default()
                    .into_iter()
                    .map(|(t, ps)| serde_json::json!({"topic": t, "partitions": ps}))
                    .collect();
                serde_json::json!({
                    "member_id": m.member_id, "instance_id": m.instance_id,
                    "client_id": m.client_id, "assignment": assignment,
                })
            })
            .collect();
        let partitions: Vec<serde_json::Value> = self
            .partitions
            .iter()
            .map(|p| {
                serde_json::json!({
                    "topic": p.topic, "partition": p.partition, "committed": p.committed,
                    "log_end": p.log_end, "lag": p.lag(), "owner": p.owner,
                })
            })
            .collect();
        serde_json::json!({
            "group": d.group_id, "state": d.state, "protocol_type": d.protocol_type,
            "protocol": d.protocol, "generation": d.generation, "leader": d.leader,
            "members": members, "partitions": partitions,
        })
    }
}

/// `consume --group`: a member of `group` printing what it is given and
/// committing what it printed, every second and when it stops.
pub async fn consume_in_group(
    args: ConsumeArgs,
    mut config: ConsumerConfig,
    group: String,
) -> anyhow::Result<()> {
    let mut settings = GroupSettings::new(group.clone());
    settings.instance_id = args.instance_id.clone();
    if let Some(ms) = args.session_timeout_ms {
        settings.session_timeout = Duration::from_millis(ms);
        settings.heartbeat_interval =
            settings.heartbeat_interval.min(Duration::from_millis(ms / 3).max(Duration::from_millis(10)));
    }
    // Commits are ours: only what reached stdout counts as consumed. The
    // consumer commits its positions before a revoke; by then every polled
    // record has been printed.
    settings.auto_commit_interval = None;
    config.group = Some(settings);
    if args.from_beginning {
        config.offset_reset = OffsetReset::Earliest;
    }
    let bootstrap = config.client.bootstrap.clone();
    let mut consumer =
        Consumer::new(config).await.with_context(|| format!("cannot connect to {bootstrap}"))?;
    consumer
        .subscribe(std::slice::from_ref(&args.topic))
        .await
        .with_context(|| format!("cannot subscribe group `{group}` to `{}`", args.topic))?;

    let mut sigint = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    let mut sigterm = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let max = args.max_messages.unwrap_or(u64::MAX);
    let idle = args.idle_timeout_ms.map(Duration::from_millis);
    let mut printed = 0u64;
    let mut idle_since = tokio::time::Instant::now();
    let mut last_commit = tokio::time::Instant::now();
    // Next offset to commit per partition: one past the last printed record.
    let mut done: BTreeMap<(String, u32), u64> = BTreeMap::new();
    let stdout = std::io::stdout();
    let mut outcome = Ok(());
    while printed < max {
        let records = tokio::select! {
            r = consumer.poll(Duration::from_millis(500)) => match r {
                Ok(r) => r,
                Err(e) => { outcome = Err(anyhow::Error::new(e).context("poll failed")); break; }
            },
            _ = sigint.recv() => break,
            _ = sigterm.recv() => break,
        };
        if !records.is_empty() {
            idle_since = tokio::time::Instant::now();
        } else if idle.is_some_and(|d| idle_since.elapsed() >= d) {
            break;
        }
        let mut out = std::io::BufWriter::new(stdout.lock());
        let mut write = || -> std::io::Result<()> {
            for r in &records {
                if printed >= max {
                    break;
                }
                write_record(&mut out, r, args.format, &args.key_separator)?;
                printed += 1;
                done.insert((r.topic.to_string(), r.partition), r.offset + 1);
            }
            out.flush()
        };
        if let Err(e) = write() {
            outcome = broken_pipe_is_fine(e);
            break;
        }
        if last_commit.elapsed() >= COMMIT_INTERVAL && !done.is_empty() {
            commit(&mut consumer, &mut done).await;
            last_commit = tokio::time::Instant::now();
        }
    }
    commit(&mut consumer, &mut done).await;
    consumer.close().await.with_context(|| format!("cannot leave group `{group}`"))?;
    outcome
}

/// Commits and forgets `done`; a failed commit (a rebalance took the
/// partition away) is reported, not fatal: the new owner re-reads from the
/// last commit, so records may be printed twice but none is skipped.
async fn commit(consumer: &mut Consumer, done: &mut BTreeMap<(String, u32), u64>) {
    if done.is_empty() {
        return;
    }
    let offsets: Vec<(String, u32, u64)> = done.iter().map(|((t, p), o)| (t.clone(), *p, *o)).collect();
    match consumer.commit_offsets(&offsets).await {
        Ok(()) => done.clear(),
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "warning: commit failed: {e}");
        }
    }
}

/// Milliseconds since the epoch from an RFC 3339 UTC time
/// (`2026-12-03T10:00:00Z`, `2026-12-03T10:00:00.250+01:00`) or a number
/// of milliseconds.
fn parse_time_ms(s: &str) -> anyhow::Result<i64> {
    if let Ok(ms) = s.parse::<i64>() {
        return Ok(ms);
    }
    let bad = || anyhow::anyhow!("`{s}` is neither milliseconds since the epoch nor an RFC 3339 time");
    let b = s.as_bytes();
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't' | b' ') {
        return Err(bad());
    }
    if b[13] != b':' || b[16] != b':' {
        return Err(bad());
    }
    let num = |r: std::ops::Range<usize>| s.get(r).and_then(|v| v.parse::<i64>().ok()).ok_or_else(bad);
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (h, mi, sec) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || sec > 60 {
        return Err(bad());
    }
    let mut rest = &s[19..];
    let mut millis = 0i64;
    if let Some(frac) = rest.strip_prefix('.') {
        let digits = frac.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return Err(bad());
        }
        let ms: String = frac[..digits].chars().chain("000".chars()).take(3).collect();
        millis = ms.parse().map_err(|_| bad())?;
        rest = &frac[digits..];
    }
    let offset_s = match rest {
        "Z" | "z" => 0,
        _ => {
            let sign = match rest.as_bytes().first() {
                Some(b'+') => 1,
                Some(b'-') => -1,
                _ => return Err(bad()),
            };
            if rest.len() != 6 || rest.as_bytes()[3] != b':' {
                return Err(bad());
            }
            let oh: i64 = rest[1..3].parse().map_err(|_| bad())?;
            let om: i64 = rest[4..6].parse().map_err(|_| bad())?;
            sign * (oh * 3600 + om * 60)
        }
    };
    let days = days_from_civil(y, mo, d);
    Ok(((days * 86_400 + h * 3600 + mi * 60 + sec - offset_s) * 1000) + millis)
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's
/// algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = if y >= 0 { y } else { y - 399 } / 400;
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::parse_time_ms;

    #[test]
    fn rfc3339_times() {
        assert_eq!(parse_time_ms("0").unwrap(), 0);
        assert_eq!(parse_time_ms("1970-01-01T00:00:00Z").unwrap(), 0);
        assert_eq!(parse_time_ms("2000-03-01T00:00:00Z").unwrap(), 951_868_800_000);
        assert_eq!(parse_time_ms("2026-12-03T10:00:00.25Z").unwrap(), 1_796_292_000_250);
        assert_eq!(parse_time_ms("2026-12-03T11:00:00+01:00").unwrap(), 1_796_292_000_000);
        assert!(parse_time_ms("2026-13-03T10:00:00Z").is_err());
        assert!(parse_time_ms("yesterday").is_err());
        assert!(parse_time_ms("2026-12-03T10:00:00").is_err());
    }
}
