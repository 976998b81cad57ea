//! The nspawn rig itself: a guest boots to `running`/`degraded`, reboots with a new boot id, and reaches a host
//! service through its veth pair.

use fleet_rig::callout::NatsTransport;
use fleet_rig::nspawn::Guest;

#[test]
fn guest_boots_reboots_and_reaches_the_host() {
    // The rig's default transport (FLEET_NATS_TLS): a TLS nats-server greets in plain text too (INFO first).
    let nats = NatsTransport::from_env().start_server();
    let mut guest = Guest::boot();
    let first = guest.boot_id();
    assert_eq!(first.len(), 36, "boot id {first:?}");

    // NATS on the host's 127.0.0.1 is reachable at the guest's own 127.0.0.1 through the relay.
    let relay = guest.forward(nats.port());
    let hello = guest.sh(&format!(
        "busybox timeout 5 busybox nc {} {} </dev/null | head -c 4",
        "127.0.0.1",
        relay.addr().port()
    ));
    assert_eq!(hello, "INFO", "the guest did not see the NATS greeting");
    // Offline: the relay refuses to carry connections; online again: it does.
    let probe = "busybox timeout 5 busybox nc 127.0.0.1 PORT </dev/null | head -c 4"
        .replace("PORT", &relay.addr().port().to_string());
    relay.set_connected(false);
    assert_eq!(
        guest.try_sh(&probe).1,
        "",
        "the relay carried a connection while offline"
    );
    relay.set_connected(true);
    assert_eq!(guest.sh(&probe), "INFO");

    let second = guest.reboot();
    assert_ne!(first, second, "a reboot gives a new boot id");
    assert!(guest.pid1().is_some());

    // A power cut keeps the disk: a file written before is there after the next boot.
    guest.sh("echo kept > /var/lib/power-cut-marker && sync");
    guest.power_cut();
    assert!(
        guest.pid1().is_none(),
        "the guest still runs after a power cut"
    );
    guest.power_on();
    assert_eq!(guest.sh("cat /var/lib/power-cut-marker").trim(), "kept");
    assert_ne!(guest.boot_id(), second);
}
