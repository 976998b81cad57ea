//! The flood guard: every poll it asks each nats-server for the busiest connections of the devices' account
//! (`$SYS.REQ.SERVER.PING.CONNZ`, as a system-account user), measures their message rates
//! ([`super::flood::Tracker`]), disconnects a device's connection that goes over its budget
//! (`$SYS.REQ.SERVER.<id>.KICK`), refuses that device's sessions for a cool-down (the callout reads the same
//! [`super::flood::Cooldowns`]; other replicas learn it on [`COOLDOWN_SUBJECT`]) and reports it to the operator
//! like a refused write (`fleet.device-refusals.<device>`, kind `flood`), so its Device, events and alerts show it.

use super::flood::{Budget, Conn, Cooldowns, Cooling, Tracker};
use fleet_wire::device_api::{refusals_subject, WriteRefused, FLOOD_KIND};
use fleet_wire::DeviceId;
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Where replicas tell each other of a cool-down (system account).
pub const COOLDOWN_SUBJECT: &str = "fleet-auth.cooldowns";
/// Connections asked for per server and poll: the busiest by messages received.
pub const TOP_CONNECTIONS: usize = 512;
/// Servers' answers taken per poll at most.
pub const MAX_SERVERS: usize = 64;
/// How long a poll waits for the servers' answers.
const ANSWER_WINDOW: Duration = Duration::from_millis(750);
/// Time-out of one KICK.
const KICK_TIMEOUT: Duration = Duration::from_secs(2);

/// The guard's settings, loaded.
#[derive(Clone)]
pub struct GuardSettings {
    /// System-account user (listed in `auth_callout.auth_users`).
    pub user: String,
    /// Its password.
    pub password: String,
    /// The budget and cool-downs.
    pub budget: Budget,
    /// Time between polls.
    pub interval: Duration,
}

#[derive(Deserialize)]
struct ServerAnswer {
    #[serde(default)]
    server: ServerInfo,
    #[serde(default)]
    data: Option<Connz>,
}

#[derive(Deserialize, Default)]
struct ServerInfo {
    #[serde(default)]
    id: String,
}

#[derive(Deserialize)]
struct Connz {
    #[serde(default)]
    connections: Vec<ConnInfo>,
}

#[derive(Deserialize)]
struct ConnInfo {
    cid: u64,
    #[serde(default)]
    in_msgs: u64,
    /// Subscriptions held now (CONNZ `subscriptions`).
    #[serde(default)]
    subscriptions: u64,
    /// For a user fleet-auth admitted: the `name` of the user JWT it issued, the device id (the client cannot
    /// set it; its CONNECT `name` is a different field).
    #[serde(default)]
    authorized_user: String,
}

/// A cool-down as replicas share it.
#[derive(Serialize, Deserialize)]
struct CooldownNotice {
    device: DeviceId,
    until: u64,
    strikes: u32,
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// The device of a connection of the devices' account: its authorized user, when it is a device id.
pub fn device_of(authorized_user: &str) -> Option<DeviceId> {
    DeviceId::try_from(authorized_user).ok()
}

/// Runs the guard until its connection ends. `system` is the system user's connection, `fleet` the buckets'
/// account connection the reports go on.
pub async fn run(
    system: async_nats::Client,
    fleet: async_nats::Client,
    account: String,
    settings: GuardSettings,
    cooldowns: Arc<Mutex<Cooldowns>>,
) -> Result<(), String> {
    let budget = settings.budget;
    let mut notices = system
        .subscribe(COOLDOWN_SUBJECT)
        .await
        .map_err(|e| format!("subscribe {COOLDOWN_SUBJECT}: {e}"))?;
    let learned = {
        let cooldowns = cooldowns.clone();
        async move {
            while let Some(m) = notices.next().await {
                if let Ok(n) = serde_json::from_slice::<CooldownNotice>(&m.payload) {
                    if let Ok(mut c) = cooldowns.lock() {
                        let cooling = Cooling {
                            until: n.until,
                            strikes: n.strikes,
                        };
                        c.learn(&n.device, cooling, unix_now(), &budget);
                    }
                }
            }
        }
    };
    let started = Instant::now();
    let polls = async move {
        let mut tracker = Tracker::default();
        let mut ticker = tokio::time::interval(settings.interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticker.tick().await;
            let conns = match connz(&system, &account, "msgs_from").await {
                Ok(c) => c,
                Err(e) => {
                    log::warn!("flood guard: {e}");
                    continue;
                }
            };
            let now_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
            for f in tracker.observe(&conns, now_ms, &budget) {
                let what = format!(
                    "{} messages a second over {:.1} s, over its budget of {}",
                    f.msgs_per_sec,
                    f.over_ms as f64 / 1000.0,
                    budget.max_msgs_per_sec
                );
                act(
                    &system,
                    &fleet,
                    &cooldowns,
                    &budget,
                    (f.server, f.cid, f.device),
                    what,
                )
                .await;
            }
            // The connections holding the most subscriptions, judged at once (a count, not a rate).
            let held = match connz(&system, &account, "subs").await {
                Ok(c) => c,
                Err(e) => {
                    log::warn!("flood guard: {e}");
                    continue;
                }
            };
            for o in super::flood::over_subscribed(&held, &budget) {
                let what = format!(
                    "{} subscriptions, over its limit of {}",
                    o.subscriptions, budget.max_subscriptions
                );
                act(
                    &system,
                    &fleet,
                    &cooldowns,
                    &budget,
                    (o.server, o.cid, o.device),
                    what,
                )
                .await;
            }
        }
    };
    tokio::select! {
        () = learned => Err(format!("the {COOLDOWN_SUBJECT} subscription ended (NATS connection closed)")),
        () = polls => Ok(()),
    }
}

/// One poll: every server's top connections of `account` by `sort` (`msgs_from`: messages received; `subs`:
/// subscriptions held).
async fn connz(
    system: &async_nats::Client,
    account: &str,
    sort: &str,
) -> Result<Vec<Conn>, String> {
    let inbox = system.new_inbox();
    let mut answers = system
        .subscribe(inbox.clone())
        .await
        .map_err(|e| format!("subscribe {inbox}: {e}"))?;
    let ask = serde_json::json!({
        "acc": account, "sort": sort, "limit": TOP_CONNECTIONS, "auth": true,
    });
    system
        .publish_with_reply("$SYS.REQ.SERVER.PING.CONNZ", inbox, ask.to_string().into())
        .await
        .map_err(|e| format!("ask CONNZ: {e}"))?;
    let mut conns = Vec::new();
    let deadline = tokio::time::Instant::now() + ANSWER_WINDOW;
    for _ in 0..MAX_SERVERS {
        let Ok(Some(m)) = tokio::time::timeout_at(deadline, answers.next()).await else {
            break;
        };
        let a: ServerAnswer = match serde_json::from_slice(&m.payload) {
            Ok(a) => a,
            Err(e) => {
                log::warn!("flood guard: a CONNZ answer is not understood: {e}");
                continue;
            }
        };
        let Some(data) = a.data else { continue };
        conns.extend(data.connections.into_iter().map(|c| Conn {
            server: a.server.id.clone(),
            cid: c.cid,
            device: device_of(&c.authorized_user),
            in_msgs: c.in_msgs,
            subscriptions: c.subscriptions,
        }));
    }
    Ok(conns)
}

/// Disconnects a connection (server, cid, device) over its budget (`what` says how), starts its device's
/// cool-down, tells the other replicas and the operator.
async fn act(
    system: &async_nats::Client,
    fleet: &async_nats::Client,
    cooldowns: &Mutex<Cooldowns>,
    budget: &Budget,
    (server, cid, device): (String, u64, DeviceId),
    what: String,
) {
    let now = unix_now();
    let Some(cooling) = cooldowns
        .lock()
        .ok()
        .map(|mut c| c.strike(&device, now, budget))
    else {
        return;
    };
    let kick = format!("$SYS.REQ.SERVER.{server}.KICK");
    let body = serde_json::json!({ "cid": cid }).to_string();
    let kicked = match tokio::time::timeout(KICK_TIMEOUT, system.request(kick, body.into())).await {
        Ok(Ok(m)) if !m.payload.windows(7).any(|w| w == b"\"error\"") => "disconnected".to_owned(),
        Ok(Ok(m)) => format!(
            "could not disconnect ({})",
            String::from_utf8_lossy(&m.payload[..m.payload.len().min(200)])
        ),
        Ok(Err(e)) => format!("could not disconnect ({e})"),
        Err(_) => "could not disconnect (no answer)".to_owned(),
    };
    let until = humantime::format_rfc3339_seconds(
        std::time::UNIX_EPOCH + Duration::from_secs(cooling.until),
    );
    let reason = format!(
        "{kicked}: {what}; its connections are refused until {until} (flood {} in a row)",
        cooling.strikes,
    );
    log::warn!("flood guard: device {device} (cid {cid} on server {server}) {reason}");
    let notice = CooldownNotice {
        device: device.clone(),
        until: cooling.until,
        strikes: cooling.strikes,
    };
    if let Ok(b) = serde_json::to_vec(&notice) {
        let _ = system.publish(COOLDOWN_SUBJECT, b.into()).await;
    }
    let report = WriteRefused {
        device_id: device.clone(),
        bucket: None,
        kind: FLOOD_KIND.into(),
        reason,
        count: 1,
    };
    if let Ok(b) = serde_json::to_vec(&report) {
        let _ = fleet.publish(refusals_subject(&device), b.into()).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_device_is_the_authorized_user() {
        assert_eq!(
            device_of("dev-a").map(|d| d.to_string()),
            Some("dev-a".into())
        );
        assert_eq!(device_of("../x"), None);
        assert_eq!(device_of(""), None);
    }

    #[test]
    fn a_connz_answer_is_read() {
        let a: ServerAnswer = serde_json::from_str(
            r#"{"server":{"name":"n","id":"NABC"},"data":{"server_id":"NABC","now":"x","connections":[
               {"cid":5,"in_msgs":42,"name":"dev-b","authorized_user":"dev-a"},{"cid":6}]}}"#,
        )
        .unwrap();
        assert_eq!(a.server.id, "NABC");
        let c = a.data.unwrap().connections;
        assert_eq!((c[0].cid, c[0].in_msgs, c.len()), (5, 42, 2));
        assert_eq!(c[0].authorized_user, "dev-a");
        assert!(c[1].authorized_user.is_empty());
    }
}
