//! libFuzzer target: the properties of `checks::socket_frame` on arbitrary bytes.
#![no_main]

#[path = "../checks.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::socket_frame(data));
