//! The FleetLock coordinated-reboot lock server (being built).
