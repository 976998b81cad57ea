//! Enrolling a new device with its own identity, from the Debian package, by the steps docs/auth.md ("Enrolling a
//! device") gives a person: a machine user of its own in the identity provider (here the Zitadel stand-in) and its
//! key, then on the device the machine key (`/etc/harmony-fleet/zitadel-key.json`, root 0600), `fleet-token.yaml`,
//! the CAs, `agent.toml` naming `token_file` (never a services password), and `apt install` of the package, whose
//! device setup gets the first token before the agent starts. Shared by `scripts/demo --add-device` and the
//! user-path test (`tests/lifecycle_e2e.rs`).

use crate::fleet::{agent_config, Artifacts, Device, GUEST_CA_FILE, GUEST_TOKEN_FILE};
use crate::packages::{self, apt};
use fleet_rig::callout::{FleetNats, AUDIENCE};
use fleet_rig::nspawn::Guest;
use std::path::Path;
use std::time::Duration;

/// Where the device keeps its machine key (docs/auth.md): root's alone.
pub const KEY_FILE: &str = "/etc/harmony-fleet/zitadel-key.json";
/// fleet-token's configuration (docs/auth.md).
pub const TOKEN_CONFIG: &str = "/etc/harmony-fleet/fleet-token.yaml";
/// The CA the identity provider's certificate is issued by (fleet-token's `ca_file`).
pub const ZITADEL_CA_FILE: &str = "/etc/harmony-fleet/zitadel-ca.pem";
/// The CA that signed nats-server's certificate (the agent's `[nats] ca_file`, docs/packages.md step 1).
pub const NATS_CA_FILE: &str = "/etc/harmony-fleet/nats-ca.pem";

/// `fleet-token.yaml` for the identity provider at `issuer` (docs/auth.md).
pub fn token_config(issuer: &str) -> String {
    format!("issuer: \"{issuer}\"\nproject_id: \"{AUDIENCE}\"\nca_file: {ZITADEL_CA_FILE}\n")
}

/// Boots a new guest and enrols it as device `id` from the package in `debs` (built by [`packages::amd64`]), with
/// a machine user of its own registered now with `nats`'s identity provider. The device reaches NATS and the
/// identity provider at the host's addresses (relayed into the guest); its updater trusts `artifacts`' CA (agent
/// upgrades). `say` hears each step. Returns once its agent and updater are active and fleet-auth admitted it;
/// an error says which step failed, with the device's journals.
pub fn from_package(
    id: &str,
    nats: &FleetNats,
    debs: &Path,
    artifacts: Option<&Artifacts>,
    say: &mut dyn FnMut(&str),
) -> Result<Device, String> {
    let (issuer, zitadel_port) = nats.zitadel().ok_or(
        "enrolment needs the identity provider: the demo's NATS runs without the auth callout (FLEET_NATS_AUTH=off)",
    )?;
    let nats_ca = nats
        .ca_file()
        .ok_or("enrolment needs NATS over TLS (FLEET_NATS_TLS=off is set)")?;
    let mut guest = Guest::boot();
    let nats_link = guest.forward(nats.port());
    guest.forward(zitadel_port);
    say(&format!("booted a Debian guest for {id}"));

    // In the identity provider: a machine user for this device, with the device id as its device_id claim, and a
    // key for it (Zitadel hands out the key's JSON once).
    let key = nats
        .machine_key(id)
        .ok_or("the identity provider did not register a machine user")?;
    say(&format!(
        "registered machine user for {id} in the identity provider and made its key"
    ));

    // On the device, as docs/auth.md tells a person.
    guest.write_file(KEY_FILE, key.as_bytes(), 0o600);
    let zca = nats
        .zitadel_ca_pem()
        .ok_or("the identity provider has no CA")?;
    guest.write_file(ZITADEL_CA_FILE, &zca, 0o644);
    guest.write_file(TOKEN_CONFIG, token_config(&issuer).as_bytes(), 0o644);
    let pem = std::fs::read(nats_ca).map_err(|e| format!("read {}: {e}", nats_ca.display()))?;
    guest.write_file(NATS_CA_FILE, &pem, 0o644);
    let url = nats.url_at(nats_link.addr());
    guest.write_file(
        "/etc/harmony-fleet/agent.toml",
        agent_config(id, &url, Some(GUEST_TOKEN_FILE)).as_bytes(),
        0o600,
    );
    if let Some(a) = artifacts {
        guest.forward(a.port());
        guest.write_file(GUEST_CA_FILE, &a.ca_pem(), 0o644);
        guest.write_file(
            "/etc/harmony-fleet/updater.toml",
            format!("extra_ca_file = \"{GUEST_CA_FILE}\"\n").as_bytes(),
            0o644,
        );
    }
    say(&format!(
        "wrote {KEY_FILE} (root 0600), {TOKEN_CONFIG}, {ZITADEL_CA_FILE}, {NATS_CA_FILE} and agent.toml (token_file = {GUEST_TOKEN_FILE})"
    ));

    let deb = packages::file_name("harmony-fleet-device");
    guest.install_file(&debs.join(&deb), &format!("/root/pkgs/{deb}"), 0o644);
    let out = apt(&guest, &["install", &format!("/root/pkgs/{deb}")]);
    let text = crate::device::text(&out);
    if !out.status.success() {
        return Err(format!(
            "apt install {deb} failed:\n{text}\n{}",
            guest.journal("fleet-agent.service", 40)
        ));
    }
    say(&format!(
        "apt install ./{deb}: {}",
        text.lines()
            .filter(|l| l.contains("fleet-token got") || l.contains("fleet-agent: active"))
            .collect::<Vec<_>>()
            .join("; ")
    ));
    let d = Device {
        id: id.to_string(),
        guest,
        nats_link,
    };
    for unit in ["fleet-updater.service", "fleet-agent.service"] {
        let up = fleet_rig::wait_for(Duration::from_secs(240), || {
            (d.guest.unit_state(unit) == "active").then_some(())
        });
        if up.is_none() {
            return Err(format!("{unit} is not active on {id}:\n{}", d.logs()));
        }
    }
    let admitted = fleet_rig::wait_for(Duration::from_secs(60), || nats.admitted(id).then_some(()));
    if admitted.is_none() {
        return Err(format!(
            "fleet-auth did not admit {id}:\n{}\n{}",
            d.logs(),
            nats.auth_logs()
        ));
    }
    say(&format!(
        "{id}: fleet-token got its token, the agent connected with it, fleet-auth admitted it"
    ));
    Ok(d)
}

/// Imports the demo's workload image into the device's agent Podman the way the demo's own devices get it: the
/// busybox root file system every demo guest carries, `podman import`ed as the fleet-agent user (docs/auth.md,
/// "Adding a device to the demo": the image is in no registry).
pub fn import_demo_image(d: &Device) {
    d.import_test_image();
}
