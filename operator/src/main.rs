//! fleet-operator: parses arguments (`cli`), sets up logging and runs the operator (`run`: the controllers, the
//! admission webhook, the dashboard) or the `buckets` command (`buckets`).

mod buckets;
mod cli;
mod run;

use std::process::ExitCode;

fn main() -> ExitCode {
    let (args, files) = match cli::parse(std::env::args().skip(1)) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    // The buckets command prints its own result; the NATS client's connection chatter stays out of it.
    let level = if args.buckets.is_some() {
        "warn"
    } else {
        "info"
    };
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or(level)).init();
    let serving = match files.read() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match args.buckets {
        Some(check) => rt.block_on(buckets::command(&args.nats_url, &args.nats, check)),
        None => rt.block_on(run::operator(args, serving)),
    }
}
