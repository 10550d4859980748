//! What the client benches share: a criterion measurement of the CPU time
//! of the calling thread (`CLOCK_THREAD_CPUTIME_ID`), so that only the
//! thread running the client is counted, not the in-process broker's.

use criterion::measurement::{Measurement, ValueFormatter};
use criterion::Throughput;
use shardlog_client::{Admin, ClientConfig};

/// A broker started in-process (one shard, unpinned, data in a temporary
/// directory) with a one-partition topic `topic`, and the runtime the bench
/// drives the client on (current-thread: the client runs on the bench's
/// thread only).
pub struct Bench {
    pub rt: tokio::runtime::Runtime,
    pub addr: String,
    pub broker: shardlog_broker::BrokerHandle,
    pub dir: tempfile::TempDir,
}

pub fn start(topic: &str) -> Bench {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut config = shardlog_broker::config::BrokerConfig::new(
        dir.path().to_path_buf(),
        "127.0.0.1:0".parse().expect("addr"),
    );
    config.shards = 1;
    config.pin_cores = false;
    let broker = shardlog_broker::start(config).expect("broker starts");
    let addr = broker.ready.listen.to_string();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    rt.block_on(async {
        let admin = Admin::connect(ClientConfig::new(addr.clone())).await.expect("admin");
        admin.create_topic(topic, 1, &[]).await.expect("create topic");
    });
    Bench { rt, addr, broker, dir }
}

/// CPU time of the calling thread, in nanoseconds.
pub fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec for the duration of the call.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID)");
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Criterion measurement: CPU nanoseconds of the bench thread.
pub struct ThreadCpu;

struct CpuFormatter;

impl ValueFormatter for CpuFormatter {
    fn scale_values(&self, _typical: f64, _values: &mut [f64]) -> &'static str {
        "cpu ns"
    }

    fn scale_throughputs(&self, _typical: f64, throughput: &Throughput, values: &mut [f64]) -> &'static str {
        if let Throughput::Elements(n) = throughput {
            for v in values.iter_mut() {
                *v /= *n as f64;
            }
        }
        "cpu ns/elem"
    }

    fn scale_for_machines(&self, _values: &mut [f64]) -> &'static str {
        "cpu ns"
    }
}

impl Measurement for ThreadCpu {
    type Intermediate = u64;
    type Value = u64;

    fn start(&self) -> u64 {
        thread_cpu_ns()
    }

    fn end(&self, start: u64) -> u64 {
        thread_cpu_ns() - start
    }

    fn add(&self, a: &u64, b: &u64) -> u64 {
        a + b
    }

    fn zero(&self) -> u64 {
        0
    }

    fn to_f64(&self, v: &u64) -> f64 {
        *v as f64
    }

    fn formatter(&self) -> &dyn ValueFormatter {
        &CpuFormatter
    }
}
