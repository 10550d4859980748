//! The Grafana dashboard `ops/grafana/shardlog.json` charts only what the
//! broker exports: every `shardlog_*` family a panel queries is in a
//! `# TYPE` line of a real broker's `GET /metrics` (after a topic was
//! created, produced to and consumed by a group), and those read through
//! `_bucket` are histograms. And the file is an importable dashboard: a
//! `${DS_PROMETHEUS}` input, the `instance` and `topic` variables, panels
//! with unique ids, each with that datasource and a query.

#[allow(dead_code, reason = "each test binary uses part of the shared helpers")]
mod common;

use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Read, Write};
use std::process::Stdio;
use std::time::Instant;

const DATASOURCE_UID: &str = "${DS_PROMETHEUS}";

fn dashboard() -> Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../ops/grafana/shardlog.json");
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {path}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path} is not JSON: {e}"))
}

/// Every panel, rows' nested panels (collapsed rows) included.
fn all_panels(dashboard: &Value) -> Vec<&Value> {
    fn walk<'a>(panels: &'a Value, out: &mut Vec<&'a Value>) {
        for p in panels.as_array().into_iter().flatten() {
            out.push(p);
            walk(&p["panels"], out);
        }
    }
    let mut out = Vec::new();
    walk(&dashboard["panels"], &mut out);
    out
}

/// The queries of every panel's targets.
fn exprs(dashboard: &Value) -> Vec<&str> {
    all_panels(dashboard)
        .into_iter()
        .flat_map(|p| p["targets"].as_array().into_iter().flatten())
        .filter_map(|t| t["expr"].as_str())
        .collect()
}

/// The `shardlog_[a-z_]+` names in `expr`, with whether each was read as a
/// histogram series (`_bucket`), as (family, bucket).
fn metric_names(expr: &str) -> Vec<(String, bool)> {
    let mut out = Vec::new();
    let mut rest = expr;
    while let Some(at) = rest.find("shardlog_") {
        let before = rest[..at].chars().next_back();
        let tail = &rest[at..];
        let len = tail.find(|c: char| !(c.is_ascii_lowercase() || c == '_')).unwrap_or(tail.len());
        if !before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
            let name = &tail[..len];
            let bucket = name.ends_with("_bucket");
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|suffix| name.strip_suffix(suffix))
                .unwrap_or(name);
            out.push((family.to_string(), bucket));
        }
        rest = &tail[len..];
    }
    out
}

/// `GET /metrics` on the admin listener: the body.
fn scrape(admin: &str) -> String {
    let mut s = std::net::TcpStream::connect(admin).expect("connect to the admin listener");
    s.set_read_timeout(Some(common::COMMAND_DEADLINE)).expect("read timeout");
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: shardlog\r\nConnection: close\r\n\r\n").expect("write");
    let mut response = String::new();
    s.read_to_string(&mut response).expect("read the response");
    assert!(response.starts_with("HTTP/1.1 200"), "GET /metrics: {response}");
    let (_, body) = response.split_once("\r\n\r\n").expect("a header end");
    body.to_string()
}

#[test]
fn dashboard_is_importable() {
    let d = dashboard();
    assert!(d["schemaVersion"].as_u64().is_some_and(|v| v >= 36), "schemaVersion {}", d["schemaVersion"]);
    let inputs = d["__inputs"].as_array().expect("__inputs");
    assert!(
        inputs.iter().any(|i| i["name"] == "DS_PROMETHEUS" && i["pluginId"] == "prometheus"),
        "no DS_PROMETHEUS prometheus input in {inputs:?}"
    );
    let vars: BTreeSet<&str> = d["templating"]["list"]
        .as_array()
        .expect("templating.list")
        .iter()
        .filter_map(|v| v["name"].as_str())
        .collect();
    assert!(vars.contains("instance") && vars.contains("topic"), "variables {vars:?}");

    let panels = all_panels(&d);
    assert!(d["panels"].as_array().is_some_and(|p| !p.is_empty()), "no panels");
    let mut ids = BTreeMap::new();
    for p in &panels {
        let id = p["id"].as_u64().unwrap_or_else(|| panic!("panel without an id: {}", p["title"]));
        if let Some(other) = ids.insert(id, &p["title"]) {
            panic!("panel id {id} is used by {other} and {}", p["title"]);
        }
        if p["type"] == "row" {
            continue;
        }
        assert_eq!(p["datasource"]["uid"], DATASOURCE_UID, "datasource of panel {}", p["title"]);
        let targets =
            p["targets"].as_array().unwrap_or_else(|| panic!("panel {} has no targets", p["title"]));
        assert!(!targets.is_empty(), "panel {} has no targets", p["title"]);
        for t in targets {
            assert!(t["expr"].as_str().is_some_and(|e| !e.is_empty()), "panel {}: target {t}", p["title"]);
            assert_eq!(t["datasource"]["uid"], DATASOURCE_UID, "datasource of a target of {}", p["title"]);
        }
        assert!(p["fieldConfig"]["defaults"]["unit"].is_string(), "panel {} has no unit", p["title"]);
    }
    assert!(panels.iter().filter(|p| p["type"] != "row").count() >= 20, "only {} panels", panels.len());
}

#[test]
fn every_metric_on_the_dashboard_is_exported() {
    let d = dashboard();
    // Family -> read as a histogram (`_bucket`) somewhere.
    let mut used: BTreeMap<String, bool> = BTreeMap::new();
    for (family, bucket) in exprs(&d).into_iter().flat_map(metric_names) {
        *used.entry(family).or_default() |= bucket;
    }
    assert!(used.len() >= 20, "only {} metric families found: {used:?}", used.len());

    let started = Instant::now();
    let dir = tempfile::tempdir().expect("tempdir");
    let extra = ["--admin-listen", "127.0.0.1:0"];
    let mut child = common::serve_command(dir.path(), 1, &extra)
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn shardlog serve");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout")).read_line(&mut line).expect("ready line");
    if !line.starts_with("shardlog ready: ") {
        let _ = child.kill();
        let _ = child.wait();
        panic!("unexpected first line {line:?}");
    }
    let field = |name: &str| line.split_whitespace().find_map(|w| w.strip_prefix(name)).map(str::to_string);
    let (Some(listen), Some(ports), Some(admin)) = (field("listen="), field("shard_ports="), field("admin="))
    else {
        let _ = child.kill();
        let _ = child.wait();
        panic!("no listen=, shard_ports= or admin= in the ready line {line:?}");
    };
    let shard_ports = ports.split(',').map(|p| p.parse().expect("port")).collect();
    let ready = common::Ready { listen, shard_ports, kafka: None };
    let broker = common::Broker::adopt(child, ready, dir, &extra);

    // Traffic, so per-partition and per-group series have samples too.
    broker.ok(&["topic", "create", "dash", "--partitions", "2"], "");
    broker.ok(&["produce", "dash"], "one\ntwo\nthree\nfour\n");
    let out = broker
        .ok(&["consume", "dash", "--from-beginning", "--group", "dash-group", "--max-messages", "4"], "");
    assert_eq!(out.lines().count(), 4, "consumed {out:?}");

    let body = scrape(&admin);
    let exported: BTreeMap<&str, &str> = body
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_once(' '))
        .filter(|(name, _)| name.starts_with("shardlog_"))
        .collect();
    eprintln!(
        "dashboard: {} families used, {} exported, broker up and scraped in {:?}",
        used.len(),
        exported.len(),
        started.elapsed()
    );

    let missing: Vec<&str> = used.keys().map(String::as_str).filter(|f| !exported.contains_key(f)).collect();
    assert!(
        missing.is_empty(),
        "{} of {} metric families on the dashboard are not in the broker's /metrics: {}",
        missing.len(),
        used.len(),
        missing.join(", ")
    );
    let not_histograms: Vec<String> = used
        .iter()
        .filter(|(family, bucket)| **bucket && exported.get(family.as_str()) != Some(&"histogram"))
        .map(|(family, _)| format!("{family} ({})", exported[family.as_str()]))
        .collect();
    assert!(
        not_histograms.is_empty(),
        "the dashboard reads _bucket series of families that are not histograms: {}",
        not_histograms.join(", ")
    );
}
