//! Logging set-up: env_logger (`RUST_LOG`, default `info,nats=off`) with one rewrite. The nats crate logs every JetStream
//! API error at ERROR, including "no message found" (code 10037), which is how JetStream answers a read of a key
//! that has no value yet: normal on a new device (no upgrade intent, no desired state). That answer is logged
//! once at INFO; every other record passes unchanged.

use log::{Level, Log, Metadata, Record};
use std::sync::atomic::{AtomicBool, Ordering};

/// Records from this target prefix are the nats crate's.
const NATS_TARGET: &str = "nats";

struct Logger {
    inner: env_logger::Logger,
    absent_logged: AtomicBool,
}

/// True for the nats crate's ERROR about a JetStream read of a key without a value.
fn is_absent_key(record: &Record) -> bool {
    record.level() == Level::Error
        && record.target().starts_with(NATS_TARGET)
        && record.args().to_string().contains("no message found")
}

impl Log for Logger {
    fn enabled(&self, metadata: &Metadata) -> bool {
        self.inner.enabled(metadata)
    }

    fn log(&self, record: &Record) {
        if is_absent_key(record) {
            if !self.absent_logged.swap(true, Ordering::SeqCst) {
                self.inner.log(
                    &Record::builder()
                        .level(Level::Info)
                        .target(module_path!())
                        .args(format_args!(
                            "a NATS KV key read found no value (normal until the operator writes it); further such answers are not logged"
                        ))
                        .build(),
                );
            }
            return;
        }
        self.inner.log(record);
    }

    fn flush(&self) {
        self.inner.flush();
    }
}

/// Installs the agent's logger. `RUST_LOG` selects levels as usual (default `info,nats=off`).
pub fn init() {
    let inner = env_logger::Builder::from_env(
        env_logger::Env::default().default_filter_or("info,nats=off"),
    )
    .build();
    let max = inner.filter();
    let logger = Logger {
        inner,
        absent_logged: AtomicBool::new(false),
    };
    if log::set_boxed_logger(Box::new(logger)).is_ok() {
        log::set_max_level(max);
    }
}
