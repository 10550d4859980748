#![no_main]
//! See `shardlog_fuzz_checks::kafka_request` for the properties checked.
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| shardlog_fuzz_checks::kafka_request(data));
