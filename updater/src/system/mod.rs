//! The system-upgrade transaction (`AptFullUpgradeV1`): a second transaction kind beside the agent upgrade, with
//! its own journal file written by the same durable-write code. One attempt id runs apt at most once.

pub mod accept;
pub mod apt;
pub mod journal;
pub mod machine;
pub mod reboot;
pub mod upgrade;

pub use upgrade::{SystemDeps, SystemUpgrades};
