//! `fleet-operator buckets`: the NATS KV buckets without Kubernetes. A module of the binary (main.rs), not of
//! the lib.

use std::process::ExitCode;

/// `fleet-operator buckets`: the buckets of the KV layout, each `exists`, `created` or `missing`, without
/// Kubernetes (a device can be set up before the operator runs: docs/device-setup.md).
pub async fn command(
    nats_url: &str,
    settings: &fleet_operator::kv::NatsSettings,
    check: bool,
) -> ExitCode {
    use fleet_operator::kv;
    let (_client, js) = match kv::connect(nats_url, &settings.tls).await {
        Ok(c) => c,
        Err(e) => {
            eprintln!("fleet-operator buckets: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut missing = Vec::new();
    for spec in fleet_wire::kv::BUCKETS {
        match js.get_key_value(spec.name).await {
            Ok(_) => println!("{:<28} exists", spec.name),
            Err(_) => missing.push(spec.name),
        }
    }
    if check {
        for name in &missing {
            println!("{name:<28} missing");
        }
        return if missing.is_empty() {
            ExitCode::SUCCESS
        } else {
            eprintln!(
                "fleet-operator buckets: {} missing; run `fleet-operator buckets` to create them",
                missing.len()
            );
            ExitCode::FAILURE
        };
    }
    if let Err(e) = kv::ensure_buckets(&js, &settings.buckets).await {
        eprintln!("fleet-operator buckets: {e}");
        return ExitCode::FAILURE;
    }
    for name in &missing {
        println!("{name:<28} created");
    }
    match kv::scale_buckets(&js, &settings.buckets).await {
        Ok(scaled) => {
            for (name, from, to) in scaled {
                println!("{name:<28} scaled from {from} to {to} replicas");
            }
            println!(
                "byte limits made for {} devices (--fleet-size; docs/kv-layout.md)",
                settings.buckets.fleet_size()
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("fleet-operator buckets: {e}");
            ExitCode::FAILURE
        }
    }
}
