//! `scripts/demo`: a local fleet driven by the real operator (kubectl → kube-apiserver → fleet-operator → NATS →
//! three nspawn Debian devices), narrated step by step (`fleet_vm_tests::demo`). Ctrl-C or SIGTERM stops it and
//! tears everything down; `--keep` leaves the fleet running until then; `--stop` stops a kept demo;
//! `--add-device NAME` asks a kept demo to enrol one more device from the package, with its own identity.

use fleet_vm_tests::demo::{Demo, Stop};
use fleet_vm_tests::demo_state::{self, Record};
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

const USAGE: &str =
    "usage: fleet-demo [--keep | --stop | --shell DEVICE | --add-device NAME]   (run it through scripts/demo)";

fn main() {
    let dir = PathBuf::from(
        std::env::var_os("FLEET_DEMO_DIR").unwrap_or_else(|| "/var/tmp/fleet-demo".into()),
    );
    let mut keep = false;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--keep" => keep = true,
            "--stop" => {
                println!("{}", demo_state::stop(&dir));
                return;
            }
            "--add-device" => {
                let Some(name) = args.next() else {
                    eprintln!("{USAGE}");
                    std::process::exit(2);
                };
                if let Err(e) = demo_state::add_device(&dir, &name) {
                    eprintln!("{e}");
                    std::process::exit(1);
                }
                return;
            }
            "--shell" => {
                let Some(device) = args.next() else {
                    eprintln!("{USAGE}");
                    std::process::exit(2);
                };
                match demo_state::shell(&dir, &device) {
                    Ok(mut cmd) => {
                        use std::os::unix::process::CommandExt;
                        let e = cmd.exec();
                        eprintln!("nsenter: {e}");
                        std::process::exit(1);
                    }
                    Err(e) => {
                        eprintln!("{e}");
                        std::process::exit(1);
                    }
                }
            }
            _ => {
                eprintln!("{USAGE}");
                std::process::exit(2);
            }
        }
    }
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        if let Err(e) = signal_hook::flag::register(sig, stop.clone()) {
            eprintln!("cannot handle signal {sig}: {e}");
        }
    }
    let record = match Record::begin(&dir) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(1);
        }
    };
    let outcome = std::panic::catch_unwind(|| -> Result<(), Stop> {
        let demo = Demo::start(&dir, &record, &stop)?;
        demo.registered()?;
        let web = demo.deploy()?;
        demo.upgrade(&web)?;
        demo.broken()?;
        demo.tasks()?;
        demo.summary()?;
        if keep {
            demo.keep(&dir, &record);
        }
        println!("\n== tearing down the devices, the operator, the API server, NATS, fleet-auth and fleetlock-server");
        Ok(())
    });
    let code = match outcome {
        Ok(Ok(())) => 0,
        Ok(Err(Stop::Interrupted)) => {
            println!("\ninterrupted: everything it started is stopped");
            130
        }
        Ok(Err(Stop::Failed(why))) => {
            println!("\nthe demo failed: {why}");
            1
        }
        Err(_) => {
            println!("\nthe demo failed (the message above says where); everything it started is stopped");
            1
        }
    };
    std::process::exit(code);
}
