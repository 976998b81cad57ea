//! The agent-upgrade transaction (seed `agent-upgrades.md`): whether a request may start one, its durable
//! journal and pure state machine, the candidate's install, executable check and probe, and the transaction that
//! prepares, cuts over, commits or rolls back. Its sibling `crate::system` is the system upgrade.

pub mod accept;
pub mod elf;
pub mod install;
pub mod journal;
pub mod machine;
pub mod probe;
pub mod transaction;
