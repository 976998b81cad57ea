//! Fleet tasks (`fleet-tasks.md`), cluster side: the `TaskRun` CRD, its frozen target plan in `task-plans`, and
//! the controller that releases system-upgrade intents (canaries first) and accepts device results.
//!
//! A product folder: it takes placement, KV helpers, CRD types and conditions from the operator's shared modules
//! and nothing from `engine.rs` or another product folder.

pub mod blocking;
pub mod controller;
pub mod fault;
pub mod intents;
pub mod pass;
pub mod planning;
pub mod progress;
pub mod schedule;
pub mod scheduler;
pub mod stall;
pub mod status;
pub mod store;
pub mod view;
pub mod webhook;
