//! The process lock on `<root>/var/lib/fleet-agent/agent.lock`, held for the process lifetime, so only one agent
//! mutates workloads: the tree's one implementation, `fleet_wire::process_lock`.

pub use fleet_wire::process_lock::{LockError, ProcessLock};

/// The program name in the lock's messages.
pub const PROGRAM: &str = "fleet-agent";
