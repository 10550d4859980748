//! Markdown: the summary of one report, and the generated table of
//! `perf-reports/README.md` (latest result of each standard workload).

use crate::plot::PlotFiles;
use crate::report::{IndexLine, Report, Stat};
use std::fmt::Write;

fn mmm(s: &Stat, scale: f64, digits: usize) -> String {
    format!("{:.d$} / {:.d$} / {:.d$}", s.min / scale, s.median / scale, s.max / scale, d = digits)
}

fn pct(x: Option<f64>) -> String {
    x.map_or_else(|| "-".into(), |v| format!("{:.0} %", v * 100.0))
}

fn bw(x: Option<f64>) -> String {
    x.map_or_else(|| "-".into(), |v| format!("{:.0} MB/s", v / 1e6))
}

/// The Markdown summary written next to a report.
#[must_use]
pub fn report_markdown(r: &Report, plots: &PlotFiles) -> String {
    let a = &r.aggregate;
    let e = &r.environment;
    let mut md = String::new();
    let _ = writeln!(md, "# {} ({}{})\n", r.workload.name, r.date, if r.quick { ", quick" } else { "" });
    let _ = writeln!(md, "{}\n", r.workload.description);
    if let Some(why) = &r.invalid {
        let _ = writeln!(
            md,
            "**INVALID: records reached a partition out of order; a fast run that reorders is not \
             a result.** {why}\n"
        );
    }
    let _ = writeln!(
        md,
        "broker build `{}`{}{} · {} build · {} · {} cores · kernel {} · disk {} {} on {}\n",
        e.git_sha,
        if e.git_dirty { " (dirty)" } else { "" },
        if e.harness_sha.is_empty() {
            String::new()
        } else {
            format!(" · harness build `{}`", e.harness_sha)
        },
        e.build_profile,
        e.cpu_model,
        e.cores,
        e.kernel,
        e.disk.fs_type,
        e.disk.model,
        e.disk.device
    );
    let _ = writeln!(
        md,
        "Broker: {} `{}` ({}), load generator CPUs {}. Mode: {}{}.\n",
        r.broker.mode,
        r.broker.args.join(" "),
        r.broker.cpus.as_deref().map_or_else(|| "unpinned".into(), |c| format!("CPUs {c}")),
        r.load_generator.cpus.as_deref().unwrap_or("unpinned"),
        r.repetitions.first().map_or("", |x| x.mode.as_str()),
        r.repetitions
            .first()
            .and_then(|x| x.target_rate_msgs_per_s)
            .map_or_else(String::new, |t| format!(" at {t:.0} msgs/s")),
    );
    let _ = writeln!(md, "{} repetition(s); min / median / max:\n", a.repetitions);
    let _ = writeln!(md, "| metric | min / median / max |\n|---|---|");
    let rows: [(&str, &Stat, f64, usize); 14] = [
        ("publish msgs/s", &a.publish_msgs_per_s, 1.0, 0),
        ("publish MB/s", &a.publish_mb_per_s, 1.0, 1),
        ("consume msgs/s", &a.consume_msgs_per_s, 1.0, 0),
        ("consume MB/s", &a.consume_mb_per_s, 1.0, 1),
        ("publish p50 (us)", &a.publish_p50_us, 1.0, 0),
        ("publish p99 (us)", &a.publish_p99_us, 1.0, 0),
        ("publish p99.9 (us)", &a.publish_p999_us, 1.0, 0),
        ("publish p99.99 (us)", &a.publish_p9999_us, 1.0, 0),
        ("publish max (us)", &a.publish_max_us, 1.0, 0),
        ("end-to-end p50 (us)", &a.e2e_p50_us, 1.0, 0),
        ("end-to-end p99 (us)", &a.e2e_p99_us, 1.0, 0),
        ("end-to-end p99.9 (us)", &a.e2e_p999_us, 1.0, 0),
        ("end-to-end max (us)", &a.e2e_max_us, 1.0, 0),
        ("broker RSS max (MiB)", &a.broker_rss_bytes_max, 1_048_576.0, 0),
    ];
    for (name, s, scale, d) in rows {
        let _ = writeln!(md, "| {name} | {} |", mmm(s, scale, d));
    }
    let _ = writeln!(md, "| broker CPU s per GB | {} |", mmm(&a.broker_cpu_s_per_gb, 1.0, 2));
    if let Some(d) = &a.drain_mb_per_s {
        let _ = writeln!(md, "| backlog drain MB/s | {} |", mmm(d, 1.0, 1));
    }
    let _ = writeln!(
        md,
        "| order violations (sum) | {} |",
        a.order_violations.map_or_else(|| "not checked".into(), |v| v.to_string())
    );
    let _ = writeln!(md, "\n## Order check\n");
    for run in &r.repetitions {
        match &run.order {
            Some(o) => {
                let _ = writeln!(
                    md,
                    "- repetition {}: {}; {} gap records excused (send failed or acks = 0), \
                     {} not judged (gap bound), {} payloads too short to check",
                    run.repetition,
                    o.describe(),
                    o.gap_records_failed,
                    o.gap_records_untracked,
                    o.unchecked_records
                );
            }
            None => {
                let _ = writeln!(md, "- repetition {}: not checked", run.repetition);
            }
        }
    }
    cpu_markdown(&mut md, r);
    breakdown_markdown(&mut md, r);
    let _ = writeln!(md, "\n## Against the machine's limits (measured {})\n", limits_when(r));
    if let Some(l) = &r.limits {
        let _ = writeln!(
            md,
            "fio O_DIRECT write {} · read {} · fdatasync p99 {} · iperf3 loopback {} · memcpy {}\n",
            bw(l.disk_write_bytes_per_s),
            bw(l.disk_read_bytes_per_s),
            l.fdatasync_p99_us.map_or_else(|| "-".into(), |v| format!("{v:.0} us")),
            bw(l.loopback_bytes_per_s),
            bw(l.memcpy_bytes_per_s)
        );
    }
    let x = &r.ratios;
    let _ = writeln!(
        md,
        "publish / disk write: {} · consume / disk read: {} · consume / loopback: {} · drain / disk read: {}\n",
        pct(x.publish_vs_disk_write),
        pct(x.consume_vs_disk_read),
        pct(x.consume_vs_loopback),
        pct(x.drain_vs_disk_read)
    );
    for p in [&plots.throughput, &plots.latency].into_iter().flatten() {
        let _ = writeln!(md, "![{p}]({p})\n");
    }
    md
}

/// Per repetition: the load generator's and the broker's CPU per record
/// and per GB (the issue-14 figures: which side is the limit), and how much
/// of the machine was idle or taken by the hypervisor (a shared host).
fn cpu_markdown(md: &mut String, r: &Report) {
    let _ = writeln!(
        md,
        "\n## CPU\n\nCPU over the measured window: cores busy on average, CPU microseconds per record \
         (published plus consumed) and CPU seconds per GB (published plus consumed bytes). The machine \
         columns are fractions of all its CPUs' time: idle, and stolen by the hypervisor for other \
         guests.\n\n| repetition | load generator cores | load generator us / record | load generator s / GB \
         | broker cores | broker us / record | broker s / GB | machine idle | machine stolen |\n\
         |---|---|---|---|---|---|---|---|---|"
    );
    for run in &r.repetitions {
        let records = (run.publish.msgs + run.consume.msgs) as f64;
        let gb = (run.publish.bytes + run.consume.bytes) as f64 / 1e9;
        let per = |cpu_s: f64, n: f64, scale: f64| {
            if n > 0.0 && cpu_s > 0.0 {
                format!("{:.3}", cpu_s * scale / n)
            } else {
                "-".into()
            }
        };
        let (lg, br) = (&run.load_generator, &run.broker);
        let frac = |f: Option<f64>| f.map_or_else(|| "-".into(), |v| format!("{:.0} %", v * 100.0));
        let _ = writeln!(
            md,
            "| {} | {:.2} | {} | {} | {:.2} | {} | {} | {} | {} |",
            run.repetition,
            lg.cpu_cores_avg,
            per(lg.cpu_s, records, 1e6),
            per(lg.cpu_s, gb, 1.0),
            br.cpu_cores_avg,
            per(br.cpu_s, records, 1e6),
            per(br.cpu_s, gb, 1.0),
            frac(run.machine.map(|m| m.idle_fraction)),
            frac(run.machine.map(|m| m.steal_fraction)),
        );
    }
}

/// Per repetition with a breakdown: the client's steps, the broker's
/// stages, the write pattern and fio's latency for it.
fn breakdown_markdown(md: &mut String, r: &Report) {
    let with: Vec<_> = r.repetitions.iter().filter_map(|x| Some((x, x.breakdown.as_ref()?))).collect();
    if with.is_empty() {
        return;
    }
    let _ = writeln!(
        md,
        "\n## Where the latency goes\n\nClient steps per measured message (they add up to its publish \
         latency); broker stages from its `shardlog_stage_duration_seconds` histograms over the window \
         (quarter-octave buckets, interpolated; per record, `fetch_wake` per woken fetch). Means add up, \
         percentiles do not. Microseconds.\n"
    );
    for (run, b) in with {
        let _ = writeln!(
            md,
            "Repetition {}: publish p50 / p99 {:.0} / {:.0}, end-to-end p50 / p99 {:.0} / {:.0}.\n",
            run.repetition,
            run.publish_latency.p50_us,
            run.publish_latency.p99_us,
            run.e2e_latency.p50_us,
            run.e2e_latency.p99_us
        );
        let _ =
            writeln!(md, "| side | step | count | mean | p50 | p99 | p99.9 |\n|---|---|---|---|---|---|---|");
        for (side, rows) in [("client", &b.client), ("broker", &b.broker)] {
            for x in rows {
                let _ = writeln!(
                    md,
                    "| {side} | {} | {} | {:.1} | {:.1} | {:.1} | {:.1} |",
                    x.step, x.count, x.mean_us, x.p50_us, x.p99_us, x.p999_us
                );
            }
        }
        if let Some(w) = &b.writes {
            let _ = writeln!(
                md,
                "\nO_DIRECT writes in the window: {} of {:.0} B on average, {:.1} MB/s.",
                w.writes,
                w.bytes as f64 / w.writes.max(1) as f64,
                w.bytes_per_s() / 1e6
            );
        }
        if let Some(f) = &b.fio {
            let ratio = if f.p99_us > 0.0 { run.e2e_latency.p99_us / f.p99_us } else { f64::NAN };
            let _ = writeln!(
                md,
                "fio, the same pattern ({} B writes at {:.1} MB/s, one in flight): completion p50 / p99 / p99.9 \
                 {:.0} / {:.0} / {:.0}; **end-to-end p99 / fio p99 = {ratio:.2}**.",
                f.block_bytes,
                f.rate_bytes_per_s / 1e6,
                f.p50_us,
                f.p99_us,
                f.p999_us
            );
        }
        let _ = writeln!(md);
    }
}

fn limits_when(r: &Report) -> String {
    match &r.limits {
        Some(l) if l.measured_at_unix_s > 0 => crate::report::utc_date(l.measured_at_unix_s),
        Some(_) => "at an unknown time".into(),
        None => "not measured".into(),
    }
}

/// Markers around the generated part of `perf-reports/README.md`; the rest
/// of the file is written by hand and kept.
pub const BEGIN: &str = "<!-- BEGIN shardlog-bench table -->";
pub const END: &str = "<!-- END shardlog-bench table -->";

/// The table of the latest full (else quick) result of each workload.
#[must_use]
pub fn readme_table(lines: &[IndexLine], standard: &[String]) -> String {
    let mut t = String::new();
    let _ = writeln!(
        t,
        "| workload | run | mode | publish msgs/s | publish MB/s | consume MB/s | publish p99 / p99.9 (us) \
         | e2e p99 / p99.9 (us) | publish / disk write | consume / disk read | consume / loopback \
         | order violations | report |"
    );
    let _ = writeln!(t, "|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for w in standard {
        let latest = |quick: bool| lines.iter().rev().find(|l| &l.workload == w && l.quick == quick);
        let Some(l) = latest(false).or_else(|| latest(true)) else {
            let _ = writeln!(t, "| {w} | not run yet | | | | | | | | | | | |");
            continue;
        };
        let order = l.order_violations.map_or_else(|| "-".into(), |v| v.to_string());
        let run = format!("{} `{}`{}", l.date, l.git_sha, if l.quick { " quick" } else { "" });
        if l.invalid {
            // Not a result: the figures are withheld, the evidence is linked.
            let _ = writeln!(
                t,
                "| {w} | {run} | {} | INVALID | | | | | | | | {order} | [json]({}) |",
                l.mode, l.report
            );
            continue;
        }
        let consume = match l.drain_mb_per_s {
            Some(d) => format!("{:.1} (drain {d:.1})", l.consume_mb_per_s),
            None => format!("{:.1}", l.consume_mb_per_s),
        };
        let consume_ratio = l.ratios.drain_vs_disk_read.or(l.ratios.consume_vs_disk_read);
        let _ = writeln!(
            t,
            "| {w} | {run} | {} | {:.0} | {:.1} | {consume} | {:.0} / {:.0} | {:.0} / {:.0} | {} | {} | {} | {order} | [json]({}) |",
            l.mode,
            l.publish_msgs_per_s,
            l.publish_mb_per_s,
            l.publish_p99_us,
            l.publish_p999_us,
            l.e2e_p99_us,
            l.e2e_p999_us,
            pct(l.ratios.publish_vs_disk_write),
            pct(consume_ratio),
            pct(l.ratios.consume_vs_loopback),
            l.report
        );
    }
    t
}

/// Replaces the generated block of `readme` (or appends one).
#[must_use]
pub fn splice_readme(readme: &str, table: &str) -> String {
    let block = format!("{BEGIN}\n{table}{END}");
    match (readme.find(BEGIN), readme.find(END)) {
        (Some(b), Some(e)) if b < e => format!("{}{block}{}", &readme[..b], &readme[e + END.len()..]),
        _ => format!("{readme}\n{block}\n"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readme_keeps_hand_written_text_and_replaces_the_table() {
        let r = crate::report::tests::sample_report();
        let line = r.index_line("x.json");
        let standard = vec!["w".to_owned(), "other".to_owned()];
        let table = readme_table(&[line], &standard);
        assert!(table.contains("| w | 2023-11-14 `abc123`"), "{table}");
        assert!(table.contains("| other | not run yet"));
        let once = splice_readme("# Perf\n\nintro\n", &table);
        let twice = splice_readme(&format!("{once}\n## Targets\nhand text\n"), &table);
        assert_eq!(twice.matches(BEGIN).count(), 1);
        assert!(twice.contains("intro") && twice.contains("hand text"));
    }

    #[test]
    fn order_violations_show_in_the_summary_and_withhold_the_figures() {
        let plots = PlotFiles::default();
        let good = report_markdown(&crate::report::tests::sample_report(), &plots);
        assert!(good.contains("| order violations (sum) | 0 |"), "{good}");
        assert!(good.contains("- repetition 0: 0 order violations") && !good.contains("INVALID"));
        let r = crate::report::tests::invalid_sample_report();
        let bad = report_markdown(&r, &plots);
        assert!(bad.contains("**INVALID") && bad.contains("| order violations (sum) | 2 |"), "{bad}");
        assert!(bad.contains("- repetition 1: 2 order violations (2 decreases"));
        let standard = vec!["w".to_owned()];
        let ok = readme_table(&[crate::report::tests::sample_report().index_line("a.json")], &standard);
        assert!(ok.contains(" | 0 | [json](a.json) |"), "{ok}");
        let table = readme_table(&[r.index_line("b.json")], &standard);
        assert!(table.contains("| INVALID |") && table.contains(" | 2 | [json](b.json) |"), "{table}");
        assert!(!table.contains("2000"), "an invalid run's rate is not shown: {table}");
        let mut old = r.index_line("c.json");
        (old.order_violations, old.invalid) = (None, false);
        assert!(readme_table(&[old], &standard).contains(" | - | [json](c.json) |"));
    }
}
