//! The coordinated-reboot client (FleetLock) used by system upgrades and by its own timer (being built).
