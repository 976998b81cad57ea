//! crdgen: prints the fleet CRDs as one multi-document YAML stream (`operator/deploy/crds.yaml` is this output;
//! `tests/deploy_drift.rs` fails when they differ).

fn main() -> std::process::ExitCode {
    match fleet_operator::deploy::crds_yaml() {
        Ok(y) => {
            print!("{y}");
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("crdgen: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
