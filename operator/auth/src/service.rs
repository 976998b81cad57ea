//! The service loop: fleet-auth's own NATS connection (an `auth_users` user, so it bypasses the callout), a queue
//! subscription on `$SYS.REQ.USER.AUTH`, and one task per request under a concurrency bound.

use super::callout::{Callout, XKEY_HEADER};
use super::config::Settings;
use super::flood::{Admissions, Cooldowns};
use super::jwks::Jwks;
use fleet_wire::log_summary::{Summaries, SUMMARY_INTERVAL};
use futures::StreamExt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::Semaphore;

/// The subject nats-server sends authorization requests to.
pub const AUTH_SUBJECT: &str = "$SYS.REQ.USER.AUTH";
/// Queue group, so that several fleet-auth replicas share the requests.
pub const QUEUE_GROUP: &str = "fleet-auth";
/// The longest pause between fleet-auth's attempts to reconnect to a restarted server. Devices come back through the
/// callout at least a second after their connection closed (the agent's reconnection pause); a device whose
/// CONNECT reaches the server before fleet-auth has subscribed again waits out the server's authorization time-out
/// and is refused. async-nats's default pauses double up to 4 s (about 1 s, then 2 s, then 4 s apart after ten
/// failed attempts), which lost that race in 4 of 6 storms of 2,000 devices (58–131 refused); fleet-auth is a
/// handful of connections, so trying every 100 ms costs nothing.
pub const RECONNECT_PAUSE_MAX: Duration = Duration::from_millis(100);

/// The pause before reconnection attempt `attempts` (1-based): at once, then doubling from 2 ms up to
/// [`RECONNECT_PAUSE_MAX`].
pub fn reconnect_pause(attempts: usize) -> Duration {
    let exp = attempts.saturating_sub(1).min(16) as u32;
    match exp {
        0 => Duration::ZERO,
        _ => Duration::from_millis(1u64 << exp).min(RECONNECT_PAUSE_MAX),
    }
}

/// Requests waiting for a permit at most (each holds its payload, ~2 KiB): past it a request is dropped at once and
/// the server refuses that client when its time-out passes, as it would have anyway.
pub const MAX_WAITING: usize = 65_536;

/// Connects and serves the callout (and the device API and flood guard, when configured) until a connection's
/// subscription ends.
pub async fn run(mut settings: Settings) -> Result<(), String> {
    let cooldowns = Arc::new(Mutex::new(Cooldowns::default()));
    let admissions = Arc::new(Mutex::new(Admissions::default()));
    let (url, tls) = (settings.url.clone(), settings.tls.clone());
    // Retired devices, watched on a connection of the buckets' account: the device API's bucket user, or (no device
    // API: devices and buckets share one account) fleet-auth's own user.
    let (retired, kicks) = super::retired::Retired::new();
    let (watch_user, watch_password) = match &settings.device_api {
        Some(api) => (api.fleet_user.clone(), api.fleet_password.clone()),
        None => (settings.user.clone(), settings.password.clone()),
    };
    let watcher = connect_user(
        &url,
        &tls,
        &watch_user,
        &watch_password,
        "fleet-auth retired devices",
    )
    .await?;
    tokio::spawn(super::retired::watch(watcher, retired.clone()));
    let guard = match (settings.flood_guard.take(), &settings.device_api) {
        (Some(g), Some(api)) => {
            let system =
                connect_user(&url, &tls, &g.user, &g.password, "fleet-auth flood guard").await?;
            let fleet = connect_user(
                &url,
                &tls,
                &api.fleet_user,
                &api.fleet_password,
                "fleet-auth flood guard (reports)",
            )
            .await?;
            let b = &g.budget;
            log::info!(
                "flood guard on, per device over all its connections: {} messages a second, {} bytes a second \
                 delivered ({} s burst), {} bytes undelivered, {} subscriptions, {} connections, admitted {} times \
                 in a row then once every {} s; polled every {} ms; cool-down {} s doubling up to {} s",
                b.max_msgs_per_sec,
                b.max_bytes_out_per_sec,
                b.burst_secs,
                b.max_pending_bytes,
                b.max_subscriptions,
                b.max_connections,
                b.connects_burst,
                b.connect_every_secs,
                g.interval.as_millis(),
                b.cooldown_secs,
                b.max_cooldown_secs
            );
            Some((
                g.budget,
                super::flood_guard::run(
                    system,
                    fleet,
                    settings.account.clone(),
                    g,
                    cooldowns.clone(),
                    admissions.clone(),
                    kicks,
                ),
            ))
        }
        _ => None,
    };
    // The callout applies the guard's connection cap and reconnect budget (none without the guard).
    let admit = guard.as_ref().map(|(b, _)| (*b, admissions));
    let guard = async move {
        match guard {
            Some((_, g)) => g.await,
            None => std::future::pending().await,
        }
    };
    let api = settings.device_api.take();
    let api_retired = retired.clone();
    let api = async move {
        match api {
            Some(api) => super::device_api::run(&url, &tls, api, api_retired).await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        r = serve_callout(settings, cooldowns, admit, retired) => r,
        r = api => r,
        r = guard => r,
    }
}

/// A connection of one of fleet-auth's users (`auth_users`: they bypass the callout), retried until it is made.
pub(super) async fn connect_user(
    url: &str,
    tls: &fleet_kit::nats_tls::NatsTls,
    user: &str,
    password: &str,
    name: &'static str,
) -> Result<async_nats::Client, String> {
    let opts = async_nats::ConnectOptions::new()
        .name(name)
        .user_and_password(user.to_owned(), password.to_owned())
        .connection_timeout(Duration::from_secs(5))
        .reconnect_delay_callback(reconnect_pause)
        .retry_on_initial_connect();
    tls.apply(opts)?
        .connect(fleet_kit::nats::servers(url))
        .await
        .map_err(|e| format!("NATS at {url} ({name}): {}", tls.explain(&e)))
}

/// The callout: a queue subscription on [`AUTH_SUBJECT`] and one task per request under a concurrency bound.
async fn serve_callout(
    settings: Settings,
    cooldowns: Arc<Mutex<Cooldowns>>,
    admissions: Option<(super::flood::Budget, Arc<Mutex<Admissions>>)>,
    retired: Arc<super::retired::Retired>,
) -> Result<(), String> {
    let jwks = Jwks::new(settings.jwks.clone())?;
    // Warm the cache; a failure is not fatal (every decision fetches again and fails closed meanwhile).
    match jwks.prefetch().await {
        Ok(n) => log::info!("JWKS {}: {n} usable keys", settings.jwks.url),
        Err(e) => log::warn!("JWKS not available yet: {e}"),
    }
    let options = || {
        async_nats::ConnectOptions::new()
            .name("fleet-auth")
            .user_and_password(settings.user.clone(), settings.password.clone())
            .connection_timeout(Duration::from_secs(5))
            .reconnect_delay_callback(reconnect_pause)
    };
    // A certificate problem is a configuration error that retrying does not fix: said at start.
    settings
        .tls
        .refuse_bad_certificates(&settings.url, settings.tls.apply(options())?)
        .await?;
    let opts = settings.tls.apply(options().retry_on_initial_connect())?;
    let client = opts
        .connect(fleet_kit::nats::servers(&settings.url))
        .await
        .map_err(|e| format!("NATS at {}: {}", settings.url, settings.tls.explain(&e)))?;
    // No device is admitted before the retired ones are known.
    retired.loaded().await;
    let mut sub = client
        .queue_subscribe(AUTH_SUBJECT, QUEUE_GROUP.into())
        .await
        .map_err(|e| format!("subscribe {AUTH_SUBJECT}: {e}"))?;
    client
        .flush()
        .await
        .map_err(|e| format!("NATS flush: {e}"))?;
    log::info!(
        "fleet-auth serving {AUTH_SUBJECT} on {} as {} (issuer {}, xkey {})",
        settings.url,
        settings.user,
        settings.issuer.public_key(),
        settings
            .xkey
            .as_ref()
            .map(|x| x.public_key())
            .unwrap_or_else(|| "off".into())
    );
    let callout = Arc::new(Callout {
        issuer: settings.issuer,
        xkey: settings.xkey,
        account: settings.account,
        policy: settings.policy,
        jwks,
        cooldowns,
        admissions,
        started: Instant::now(),
        retired,
    });
    let permits = Arc::new(Semaphore::new(settings.max_concurrent));
    let waiting = Arc::new(AtomicUsize::new(0));
    // Refusals of a verified device are logged per device: the first at once, then one line per interval with the
    // count (a device reconnecting in a loop while it cools down or over its reconnect budget would otherwise fill the log).
    let denials = Arc::new(std::sync::Mutex::new(Summaries::new(
        "connections refused for",
        SUMMARY_INTERVAL,
    )));
    tokio::spawn({
        let denials = denials.clone();
        async move {
            let mut tick = tokio::time::interval(SUMMARY_INTERVAL / 2);
            loop {
                tick.tick().await;
                let lines = match denials.lock() {
                    Ok(mut d) => d.due(Instant::now()),
                    Err(_) => Vec::new(),
                };
                for line in lines {
                    log::warn!("{line}");
                }
            }
        }
    });
    while let Some(msg) = sub.next().await {
        // Received now: a request's wait is measured from here, so each is taken off the subscription at once and
        // waits for a permit in its own task (up to MAX_WAITING of them), not unseen in the subscription's buffer.
        let received = Instant::now();
        let Some(reply) = msg.reply.clone() else {
            log::warn!("authorization request without a reply subject: ignored");
            continue;
        };
        if waiting.fetch_add(1, Ordering::SeqCst) >= MAX_WAITING {
            waiting.fetch_sub(1, Ordering::SeqCst);
            log::warn!("{MAX_WAITING} authorization requests already wait: one more dropped (the server refuses it)");
            continue;
        }
        let (permits, waiting) = (permits.clone(), waiting.clone());
        let denials = denials.clone();
        let callout = callout.clone();
        let client = client.clone();
        tokio::spawn(async move {
            let permit = permits.acquire_owned().await;
            waiting.fetch_sub(1, Ordering::SeqCst);
            let Ok(_permit) = permit else { return };
            let xkey = msg
                .headers
                .as_ref()
                .and_then(|h| h.get(XKEY_HEADER))
                .map(|v| v.as_str().to_owned());
            let started = Instant::now();
            let answer = callout
                .handle(&msg.payload, xkey.as_deref(), received)
                .await;
            let took = started.elapsed().as_secs_f64() * 1000.0;
            // The wait for a permit says whether fleet-auth is behind (a storm); the time taken, what one costs.
            let waited = (started - received).as_secs_f64() * 1000.0;
            let line = format!("{} ({took:.1} ms, {waited:.0} ms waiting)", answer.log);
            match (&answer.refused, answer.allowed) {
                (_, true) => log::info!("{line}"),
                (Some(whom), false) => {
                    let due = match denials.lock() {
                        Ok(mut d) => d.record(whom, &line, Instant::now()),
                        Err(_) => Some(line),
                    };
                    if let Some(line) = due {
                        log::warn!("{line}");
                    }
                }
                (None, false) => log::warn!("{line}"),
            }
            if let Some(bytes) = answer.reply {
                if let Err(e) = client.publish(reply, bytes.into()).await {
                    log::warn!("cannot answer an authorization request: {e}");
                }
            }
        });
    }
    Err("the authorization subscription ended (NATS connection closed)".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reconnection_is_tried_at_once_then_at_most_100_ms_apart() {
        let pauses: Vec<u128> = (1..=12).map(|a| reconnect_pause(a).as_millis()).collect();
        assert_eq!(pauses, [0, 2, 4, 8, 16, 32, 64, 100, 100, 100, 100, 100]);
        assert_eq!(reconnect_pause(usize::MAX), RECONNECT_PAUSE_MAX);
    }
}
