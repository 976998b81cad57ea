//! The service loop: fleet-auth's own NATS connection (an `auth_users` user, so it bypasses the callout), a queue
//! subscription on `$SYS.REQ.USER.AUTH`, and one task per request under a concurrency bound.

use super::callout::{Callout, XKEY_HEADER};
use super::config::Settings;
use super::flood::Cooldowns;
use super::jwks::Jwks;
use futures::StreamExt;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Semaphore;

/// The subject nats-server sends authorization requests to.
pub const AUTH_SUBJECT: &str = "$SYS.REQ.USER.AUTH";
/// Queue group, so that several fleet-auth replicas share the requests.
pub const QUEUE_GROUP: &str = "fleet-auth";

/// Connects and serves the callout (and the device API and flood guard, when configured) until a connection's
/// subscription ends.
pub async fn run(mut settings: Settings) -> Result<(), String> {
    let cooldowns = Arc::new(Mutex::new(Cooldowns::default()));
    let (url, tls) = (settings.url.clone(), settings.tls.clone());
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
            log::info!(
                "flood guard on: {} messages a second and {} subscriptions per device connection, polled every {} \
                 ms; cool-down {} s doubling up to {} s",
                g.budget.max_msgs_per_sec,
                g.budget.max_subscriptions,
                g.interval.as_millis(),
                g.budget.cooldown_secs,
                g.budget.max_cooldown_secs
            );
            Some(super::flood_guard::run(
                system,
                fleet,
                settings.account.clone(),
                g,
                cooldowns.clone(),
            ))
        }
        _ => None,
    };
    let guard = async move {
        match guard {
            Some(g) => g.await,
            None => std::future::pending().await,
        }
    };
    let api = settings.device_api.take();
    let api = async move {
        match api {
            Some(api) => super::device_api::run(&url, &tls, api).await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        r = serve_callout(settings, cooldowns) => r,
        r = api => r,
        r = guard => r,
    }
}

/// A connection of one of fleet-auth's users (`auth_users`: they bypass the callout), retried until it is made.
pub(super) async fn connect_user(
    url: &str,
    tls: &crate::nats_tls::NatsTls,
    user: &str,
    password: &str,
    name: &'static str,
) -> Result<async_nats::Client, String> {
    let opts = async_nats::ConnectOptions::new()
        .name(name)
        .user_and_password(user.to_owned(), password.to_owned())
        .connection_timeout(Duration::from_secs(5))
        .retry_on_initial_connect();
    tls.apply(opts)?
        .connect(crate::kv::servers(url))
        .await
        .map_err(|e| {
            format!(
                "NATS at {url} ({name}): {}",
                tls.explain(&crate::kv::error_chain(&e))
            )
        })
}

/// The callout: a queue subscription on [`AUTH_SUBJECT`] and one task per request under a concurrency bound.
async fn serve_callout(settings: Settings, cooldowns: Arc<Mutex<Cooldowns>>) -> Result<(), String> {
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
    };
    // A certificate problem is a configuration error that retrying does not fix: said at start.
    settings
        .tls
        .refuse_bad_certificates(&settings.url, settings.tls.apply(options())?)
        .await?;
    let opts = settings.tls.apply(options().retry_on_initial_connect())?;
    let client = opts
        .connect(crate::kv::servers(&settings.url))
        .await
        .map_err(|e| {
            format!(
                "NATS at {}: {}",
                settings.url,
                settings.tls.explain(&crate::kv::error_chain(&e))
            )
        })?;
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
    });
    let permits = Arc::new(Semaphore::new(settings.max_concurrent));
    while let Some(msg) = sub.next().await {
        let Some(reply) = msg.reply.clone() else {
            log::warn!("authorization request without a reply subject: ignored");
            continue;
        };
        let Ok(permit) = permits.clone().acquire_owned().await else {
            break;
        };
        let callout = callout.clone();
        let client = client.clone();
        tokio::spawn(async move {
            let xkey = msg
                .headers
                .as_ref()
                .and_then(|h| h.get(XKEY_HEADER))
                .map(|v| v.as_str().to_owned());
            let started = std::time::Instant::now();
            let answer = callout.handle(&msg.payload, xkey.as_deref()).await;
            let took = started.elapsed().as_secs_f64() * 1000.0;
            if answer.allowed {
                log::info!("{} ({took:.1} ms)", answer.log);
            } else {
                log::warn!("{} ({took:.1} ms)", answer.log);
            }
            if let Some(bytes) = answer.reply {
                if let Err(e) = client.publish(reply, bytes.into()).await {
                    log::warn!("cannot answer an authorization request: {e}");
                }
            }
            drop(permit);
        });
    }
    Err("the authorization subscription ended (NATS connection closed)".into())
}
