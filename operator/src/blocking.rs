//! A Device's `status.blocking` entry, shared by every planner that holds a change back from a device: the rollouts'
//! (deployments/blocking.rs words FleetDeployments and AgentReleases) and the TaskRun controller's
//! (tasks/blocking.rs). Only the type, its bounds and the listing live here; each planner words its own reasons.
//! How the two lists meet in one Device status: [`crate::task_reasons`].

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Most reasons a Device lists (`blockingMore` counts the rest).
pub const MAX_BLOCKING: usize = 16;
/// Longest message, in characters (cut to fit, ending in `…`; only a very long change name needs it).
pub const MAX_MESSAGE_CHARS: usize = 400;
/// Longest part of a message a device's report gives (its reason and error), so that what to do always shows.
pub const MAX_REPORTED_CHARS: usize = 160;

/// What kind of reason holds a change back from a device (stable names: scripts and alerts may match them).
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum BlockingKind {
    /// The change's rollout is halted: no device gets it until a person acts.
    Halted,
    /// Not a canary: waits until every canary is updated.
    WaitingForCanaries,
    /// Not a canary: every canary is updated, some still soak (`until`).
    Soaking,
    /// maxUnavailable devices are already updating or soaking.
    MaxUnavailable,
    /// Silent for longer than the rollout's heartbeat timeout: the change waits until it is heard from.
    Offline,
    /// One of its filesystems has less free space than the floor (fleet-wire's `FREE_SPACE_FLOOR_BYTES`): the
    /// change waits until the device reports room (not failed, holds no maxUnavailable slot).
    NotEnoughSpace,
    /// Given the change and on its way (`since`: the phase it reported).
    Updating,
    /// Given the change and stuck in a phase beyond its bound, or silent, since `since`.
    Stalled,
    /// Its attempt failed to download the agent, or its workload's image could not be pulled.
    DownloadFailed,
    /// Its agent upgrade failed and so did the rollback: never retried, a person sees to the device.
    RollbackFailed,
    /// Its attempt failed for another reason (in the message).
    Failed,
    /// It runs the change and failed its soak (restarted, fell silent).
    SoakFailed,
    /// It runs the change and keeps restarting.
    CrashLooping,
    /// It runs the change and fails its health check.
    Unhealthy,
}

/// One change a device does not have yet, and why.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Blocking {
    /// The reason's kind.
    pub kind: BlockingKind,
    /// The change: `FleetDeployment/<name>`, `AgentRelease/<name>` or `TaskRun/<namespace>/<name>`.
    pub change: String,
    /// One sentence for a person, the change named first, with times (RFC 3339, UTC) and what to do.
    pub message: String,
    /// Since when it holds, where the device or the rule says (RFC 3339, UTC).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<String>,
    /// Until when at the earliest, for a soak (RFC 3339, UTC).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until: Option<String>,
}

/// A change's kind and name, as `status.blocking[].change` shows it.
pub fn change(kind: &str, name: &str) -> String {
    format!("{kind}/{name}")
}

/// `text` cut to `max` characters (ending in `…`).
pub fn cut(text: String, max: usize) -> String {
    if text.chars().count() <= max {
        return text;
    }
    let mut m: String = text.chars().take(max - 1).collect();
    m.push('…');
    m
}

/// A device's reasons as its status holds them: at most [`MAX_BLOCKING`], and how many more.
pub fn listed(all: &[Blocking]) -> (&[Blocking], Option<u32>) {
    let more = all.len().saturating_sub(MAX_BLOCKING);
    (
        &all[..all.len().min(MAX_BLOCKING)],
        (more > 0).then_some(more as u32),
    )
}
