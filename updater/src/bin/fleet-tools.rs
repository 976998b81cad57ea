//! `fleet-tools`: the device's root tools in one multicall binary (thin main; see `fleet_updater::tools`).

fn main() {
    fleet_updater::tools::main()
}
