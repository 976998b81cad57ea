//! `fleet-wire`: every contract that crosses a process or a network boundary in Harmony Fleet.
//!
//! Types validate in their constructors and on deserialization, so a value of a type here is valid by
//! construction. Canonical digests, KV bucket and key names, the updater socket protocol and the limits table
//! live here too. This crate does no I/O beyond reading and writing frames on a caller's reader or writer, except
//! the OS primitives every process must share behind the `os` feature ([`durable`], [`notify`],
//! [`process_lock`], [`bounded`] reads of small files, the [`cli`] parser, and `window::Window::resolve`'s
//! reading of the system time zone database).

pub mod artifact;
pub mod auth;
#[cfg(feature = "os")]
pub mod bounded;
#[cfg(feature = "os")]
pub mod cli;
pub mod device;
pub mod device_api;
pub mod diagnostics;
pub mod digest;
#[cfg(feature = "os")]
pub mod durable;
mod error;
pub mod fetch;
#[doc(hidden)]
#[cfg(any(test, feature = "fixtures"))]
pub mod fixtures;
pub mod fleetlock;
pub mod health;
pub mod ids;
pub mod journal;
pub mod kv;
pub mod limits;
pub mod log_summary;
#[cfg(feature = "os")]
pub mod notify;
pub mod probe;
#[cfg(feature = "os")]
pub mod process_lock;
pub mod resources;
pub mod secrets;
pub mod socket;
pub mod status;
pub mod taskrun;
pub mod tasks;
pub mod text;
pub mod time;
#[cfg(feature = "tls")]
pub mod tls_problem;
pub mod upgrade;
pub mod usage;
pub mod window;
pub mod workload;

pub use artifact::{Artifact, HttpsUrl, OciReference};
pub use device::{Capability, DeviceInfo, DeviceRetirement, Heartbeat, OsInfo};
pub use error::ValidationError;
pub use fetch::{FetchFailure, FetchRequest};
pub use health::{HealthCheck, HealthProbe, HealthState, HttpProbe, TcpProbe};
pub use ids::{Architecture, AttemptId, DeviceId, Id128, Sha256Hex, UnitName, Version};
pub use journal::{CutoverStep, JournalPhase, SystemJournalPhase};
pub use probe::{SelfTestCheck, SelfTestReport};
pub use resources::Resources;
pub use secrets::{DeviceSecrets, Hidden, RegistryAuth, SecretUse, SecretValue};
pub use socket::{ErrorCode, Request, RequestFrame, Response, ResponseFrame, UpdaterStatus};
pub use status::{AgentUpgradeStatus, Transition, UpgradePhase, UpgradeReason};
pub use taskrun::{
    TaskPlan, TaskPlanChunk, TaskPlanManifest, TaskRunPhase, TaskRunReason, TaskRunStatus,
};
pub use tasks::{
    SystemUpgradeAttempt, SystemUpgradePhase, SystemUpgradeReason, SystemUpgradeStatus,
    TaskOperation,
};
pub use text::{BoundedText, Transitions};
pub use time::Timestamp;
pub use upgrade::{AgentUpgradeAttempt, ByteLimit};
pub use usage::{DeviceUsage, FilesystemRole, FilesystemUsage, MemoryUsage};
pub use workload::{
    DesiredState, DeviceWorkloadStatus, FailureReason, PortMapping, Protocol, RestartPolicy,
    Restarts, VolumeMount, WorkloadFailure, WorkloadName, WorkloadSpec, WorkloadState,
    WorkloadStatus,
};
