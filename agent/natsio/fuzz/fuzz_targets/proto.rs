//! libFuzzer target: the NATS protocol parser of fleet-nats (see `../checks.rs`).
#![no_main]

#[path = "../checks.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::proto(data));
