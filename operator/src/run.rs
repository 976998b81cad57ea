//! The operator's start-up: binds the admission webhook, connects to Kubernetes, starts the controllers, the
//! webhook, the dashboard with its alerts and `/metrics`, and runs until one of them ends (exit 1) or Ctrl-C
//! (exit 0). A module of the binary (main.rs), not of the lib.

use crate::cli::{Options, Serving};
use std::process::ExitCode;

/// Runs the operator with `args` until a controller ends or Ctrl-C.
pub async fn operator(args: Options, serving: Serving) -> ExitCode {
    let Serving { webhook, dashboard } = serving;
    // Bound first, so that a port in use stops the operator before anything else; served once the caches
    // exist (the webhook reads the WorkloadPolicies from the operator's own cache).
    let webhook = match webhook {
        None => None,
        Some((addr, tls)) => match tokio::net::TcpListener::bind(&addr).await {
            Ok(l) => Some((addr, l, tls)),
            Err(e) => {
                log::error!("webhook: listen on {addr}: {e}");
                return ExitCode::FAILURE;
            }
        },
    };
    let client = match kube::Client::try_default().await {
        Ok(c) => c,
        Err(e) => {
            log::error!("cannot reach the Kubernetes API (set KUBECONFIG or run in a pod): {e}");
            return ExitCode::FAILURE;
        }
    };
    let opts = fleet_operator::deployments::engine::Options {
        nats_url: args.nats_url,
        instance: std::env::var("POD_NAME").ok(),
        label_selector: std::env::var("FLEET_LABEL_SELECTOR")
            .ok()
            .filter(|s| !s.is_empty()),
        nats: args.nats,
        secrets_namespace: args.secrets_namespace,
    };
    let schedule_opts = fleet_operator::tasks::scheduler::Options::new(
        opts.instance.clone(),
        opts.label_selector.clone(),
    );
    let task_opts = fleet_operator::tasks::controller::Options {
        nats_url: opts.nats_url.clone(),
        instance: opts.instance.clone(),
        label_selector: opts.label_selector.clone(),
        accept_timeout: args.accept_timeout,
        nats: opts.nats.clone(),
    };
    // One runtime: one watch and cache per kind, one NATS connection, and the heartbeat and device-info mirrors
    // the deployments controller keeps current for the dashboard, its alerts and the TaskRun controller.
    let rt = fleet_operator::runtime::Runtime::new(
        client,
        &opts.label_selector,
        &opts.nats_url,
        opts.nats.clone(),
    );
    if let Some((addr, l, tls)) = webhook {
        log::info!(
            "admission webhook on https://{addr} ({} and {})",
            fleet_operator::webhook::FIELDS_PATH,
            fleet_operator::tasks::webhook::PATH
        );
        tokio::spawn(fleet_operator::webhook::serve(
            l,
            tls,
            rt.caches.policies.clone(),
        ));
    }
    let dashboard = fleet_operator::dashboard::run(&rt, dashboard);
    tokio::select! {
        r = dashboard => {
            if let Err(e) = r {
                log::error!("{e}");
            }
            ExitCode::FAILURE
        }
        r = fleet_operator::deployments::engine::run_with(&rt, opts) => {
            if let Err(e) = r {
                log::error!("{e}");
            }
            ExitCode::FAILURE
        }
        r = fleet_operator::tasks::scheduler::run_with(rt.client.clone(), &rt.caches, schedule_opts) => {
            if let Err(e) = r {
                log::error!("task schedules: {e}");
            }
            ExitCode::FAILURE
        }
        r = fleet_operator::tasks::controller::run_with(
            &rt,
            task_opts,
            fleet_operator::tasks::controller::DeviceInfoSource::Shared,
        ) => {
            if let Err(e) = r {
                log::error!("task runs: {e}");
            }
            ExitCode::FAILURE
        }
        r = fleet_operator::diagnostics::controller::run_with(&rt) => {
            if let Err(e) = r {
                log::error!("diagnostics: {e}");
            }
            ExitCode::FAILURE
        }
        _ = tokio::signal::ctrl_c() => ExitCode::SUCCESS,
    }
}
