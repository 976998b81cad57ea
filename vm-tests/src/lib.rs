//! `fleet-vm-tests`: whole-device scenarios on real systemd. The tests in `tests/` boot Debian guests with
//! systemd-nspawn (`fleet_rig::nspawn`), install Harmony Fleet with `scripts/device-setup`, and drive upgrades.

pub mod builds;
pub mod cluster;
pub mod controller_manager;
pub mod demo;
pub mod demo_state;
pub mod device;
pub mod enrol;
pub mod fleet;
pub mod fleetlock;
pub mod inspect;
pub mod instructions;
pub mod lanes;
pub mod local_fleet;
pub mod packages;
pub mod qemu;
pub mod qemu_tasks;
pub mod reboots_page;
pub mod retire;
pub mod runner;
pub mod scene;
pub mod sim;
pub mod tasks;
