//! Real applications on a device, against real Podman, a real nats-server and a real registry (distribution 2.8,
//! TLS from a test CA, htpasswd basic auth): an image pulled with the credentials delivered in
//! `device-secrets/<device>`, a wrong password that fails as `image-pull-failed: unauthorized` while the old
//! container keeps running, a rotated password used by the next pull; Secret values as an environment variable
//! and as a 0400 file inside the container, a value not delivered yet failing as `secret-missing` with nothing
//! touched, and unused Podman secrets removed. No password or value appears in the agent's log or its status.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
use base64::Engine;
use common::*;
use fleet_rig::registry::Registry;
use fleet_rig::tls::TestCa;
use fleet_wire::kv;
use fleet_wire::secrets::{DeviceSecrets, Hidden, RegistryAuth, SecretUse, SecretValue};
use fleet_wire::{
    DesiredState, DeviceId, FailureReason, WorkloadName, WorkloadSpec, WorkloadState,
    WorkloadStatus,
};
use std::collections::BTreeMap;
use std::time::Duration;

const USER: &str = "fleet-puller";
const FIRST_PASSWORD: &str = "first-Pa55word-7Qx";
const WRONG_PASSWORD: &str = "wrong-Pa55word-9Zk";
const ROTATED_PASSWORD: &str = "rotated-Pa55word-3Vm";
const TOKEN: &str = "api-token-value-5Jd";
const CERT: &str = "-----BEGIN TEST CERT-----\nc2VjcmV0LWNlcnQtYm9keQ==\n-----END TEST CERT-----\n";

fn device() -> DeviceId {
    DeviceId::try_from(DEVICE).unwrap()
}

fn spec(name: &str, image: &str) -> WorkloadSpec {
    let mut w = WorkloadSpec::new(WorkloadName::try_from(name).unwrap(), image).unwrap();
    w.command = vec!["sleep".into(), "1000".into()];
    w
}

fn put_desired(rig: &Rig, generation: u64, workloads: Vec<WorkloadSpec>) {
    let d = DesiredState::new(device(), generation, workloads).unwrap();
    store(&rig.nc(), kv::DESIRED_STATE)
        .put(DEVICE, serde_json::to_vec(&d).unwrap())
        .expect("put desired");
}

fn put_secrets(rig: &Rig, registries: &[(&str, &str, &str)], values: &[(&str, &str, &str, &str)]) {
    let d = DeviceSecrets {
        device_id: device(),
        registries: registries
            .iter()
            .map(|(host, user, password)| {
                (
                    (*host).to_owned(),
                    RegistryAuth {
                        username: (*user).into(),
                        password: Hidden((*password).into()),
                    },
                )
            })
            .collect(),
        values: values
            .iter()
            .map(|(secret, key, version, value)| SecretValue {
                secret: (*secret).into(),
                key: (*key).into(),
                version: (*version).into(),
                value: Hidden(base64::engine::general_purpose::STANDARD.encode(value)),
            })
            .collect(),
    };
    store(&rig.nc(), kv::DEVICE_SECRETS)
        .put(DEVICE, serde_json::to_vec(&d).unwrap())
        .expect("put device secrets");
}

/// The workload's status in the published status of `generation`.
fn status_of(rig: &Rig, generation: u64, name: &str) -> Option<WorkloadStatus> {
    let s: fleet_wire::DeviceWorkloadStatus =
        get_json(&store(&rig.nc(), kv::WORKLOAD_STATUS), DEVICE)?;
    (s.generation == generation)
        .then(|| s.workloads.into_iter().find(|w| w.name.as_str() == name))
        .flatten()
}

/// `<container id> <state>` of `fleet-<name>`.
fn id_state(rig: &Rig, name: &str) -> String {
    rig.podman.as_ref().unwrap().podman(&[
        "inspect",
        "--format",
        "{{.Id}} {{.State.Status}}",
        &format!("fleet-{name}"),
    ])
}

/// A rig whose device-secrets bucket exists (the operator creates it on a real fleet).
fn rig() -> Rig {
    let rig = Rig::new(true, "");
    fleet_rig::nats_client::create_buckets(&rig.nc(), &[kv::DEVICE_SECRETS]);
    rig
}

/// Fails if any of `secrets` (or its base64) is in the agent's log or the device's published workload status.
fn assert_nothing_leaked(rig: &Rig, agent: &Agent, secrets: &[&str]) {
    let log = agent.log_text();
    let status = store(&rig.nc(), kv::WORKLOAD_STATUS)
        .get(DEVICE)
        .ok()
        .flatten()
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default();
    for s in secrets {
        let b64 = base64::engine::general_purpose::STANDARD.encode(s);
        for (what, text) in [("agent log", &log), ("workload status", &status)] {
            assert!(
                !text.contains(s) && !text.contains(&b64),
                "a secret appears in the {what}:\n{text}"
            );
        }
    }
}

/// Credentials from `device-secrets` pull a private image; a wrong password fails the next pull as
/// `image-pull-failed: unauthorized` and the running container stays (same id, running); the rotated password,
/// once delivered, is used by the next pass without waiting for the failure's retry back-off.
#[test]
fn private_images_pull_with_delivered_credentials_and_rotation() {
    let ca = TestCa::new();
    let mut reg = Registry::start_with_htpasswd(&ca, USER, FIRST_PASSWORD);
    reg.push_busybox("team/app", "1");
    reg.push_busybox("team/app", "2");
    let host = reg.host();
    let image = |tag: &str| format!("{host}/team/app:{tag}");
    let rig = rig();
    rig.podman
        .as_ref()
        .unwrap()
        .trust_registry(&host, ca.ca_file());

    put_secrets(&rig, &[(&host, USER, FIRST_PASSWORD)], &[]);
    put_desired(&rig, 1, vec![spec("app", &image("1"))]);
    let mut agent = rig.spawn_agent();
    agent.wait_ready();
    eventually(&agent, Duration::from_secs(60), "app running", || {
        (status_of(&rig, 1, "app")?.state == WorkloadState::Running).then_some(())
    });
    let running = id_state(&rig, "app");
    assert!(running.ends_with(" running"), "{running}");

    // A wrong password: the pull of tag 2 is refused, the container of tag 1 keeps running.
    put_secrets(&rig, &[(&host, USER, WRONG_PASSWORD)], &[]);
    put_desired(&rig, 2, vec![spec("app", &image("2"))]);
    let failed = eventually(&agent, Duration::from_secs(30), "app failed", || {
        status_of(&rig, 2, "app").filter(|s| s.state == WorkloadState::Failed)
    });
    let error = failed.error.as_ref().expect("error").as_str().to_owned();
    assert!(
        error.starts_with("image-pull-failed: unauthorized"),
        "{error}"
    );
    assert!(
        error.contains(&host) && error.contains("keeps running"),
        "{error}"
    );
    let failure = failed.failure.expect("failure");
    assert_eq!(failure.reason, FailureReason::ImagePullFailed);
    assert_eq!(
        failure.running_container_id.as_deref(),
        running.split(' ').next()
    );
    assert_eq!(
        id_state(&rig, "app"),
        running,
        "the old container is untouched"
    );

    // The password is rotated at the registry and the new one delivered: the next pass pulls.
    reg.set_password(ROTATED_PASSWORD);
    put_secrets(&rig, &[(&host, USER, ROTATED_PASSWORD)], &[]);
    eventually(
        &agent,
        Duration::from_secs(20),
        "app running tag 2 with the rotated password",
        || (status_of(&rig, 2, "app")?.state == WorkloadState::Running).then_some(()),
    );
    let now = id_state(&rig, "app");
    assert_ne!(now, running, "replaced by the container of tag 2");
    let p = rig.podman.as_ref().unwrap();
    assert_eq!(
        p.podman(&["inspect", "--format", "{{.ImageName}}", "fleet-app"]),
        image("2")
    );
    assert_nothing_leaked(
        &rig,
        &agent,
        &[FIRST_PASSWORD, WRONG_PASSWORD, ROTATED_PASSWORD],
    );
    // Nothing on disk either: no auth file was written in Podman's directory.
    let found = std::process::Command::new("grep")
        .args(["-rlF", ROTATED_PASSWORD])
        .arg(p.dir())
        .output()
        .expect("grep");
    assert!(
        found.stdout.is_empty(),
        "the password is in a file: {}",
        String::from_utf8_lossy(&found.stdout)
    );
    agent.sigterm();
    assert!(agent.wait_exit(Duration::from_secs(30)).success());
}

fn with_secrets(version: &str) -> WorkloadSpec {
    let mut w = spec("api", IMAGE);
    let use_ = |key: &str, env: Option<&str>, file: Option<&str>, uid: Option<u32>| SecretUse {
        secret: "api-credentials".into(),
        key: key.into(),
        env: env.map(Into::into),
        file: file.map(Into::into),
        uid,
        version: Some(version.into()),
    };
    w.secrets = vec![
        use_("token", Some("API_TOKEN"), None, None),
        use_("cert.pem", None, Some("/run/secrets/cert.pem"), Some(1000)),
    ];
    w
}

fn podman_secrets(rig: &Rig) -> Vec<String> {
    let out = rig
        .podman
        .as_ref()
        .unwrap()
        .podman(&["secret", "ls", "--format", "{{.Name}}"]);
    let mut names: Vec<String> = out.lines().map(str::to_owned).collect();
    names.sort();
    names
}

/// Secret values reach the container as an environment variable and as a file (mode 0400, owned by the use's
/// uid); a version not delivered yet fails as `secret-missing` and touches nothing; delivered, it runs; a
/// replacement leaves no unused Podman secret behind, and never removes one a container still uses.
#[test]
fn secrets_reach_the_container_as_env_and_file() {
    let rig = rig();
    let values = |version: &str| {
        vec![
            ("api-credentials", "token", version.to_owned(), TOKEN),
            ("api-credentials", "cert.pem", version.to_owned(), CERT),
        ]
    };
    let put_values = |version: &str| {
        let v = values(version);
        let v: Vec<(&str, &str, &str, &str)> = v
            .iter()
            .map(|(s, k, ver, val)| (*s, *k, ver.as_str(), *val))
            .collect();
        put_secrets(&rig, &[], &v);
    };
    put_values("11");
    put_desired(&rig, 1, vec![with_secrets("11")]);
    // The reconcile passes' judgement of a failed spec is logged (below: passes that left it alone).
    let mut agent = Agent::spawn_logging(
        &rig.config,
        rig.root.path(),
        "info,fleet_agent::reconcile=debug",
    );
    agent.wait_ready();
    eventually(&agent, Duration::from_secs(60), "api running", || {
        (status_of(&rig, 1, "api")?.state == WorkloadState::Running).then_some(())
    });
    let p = rig.podman.as_ref().unwrap();
    let seen = p.podman(&[
        "exec",
        "fleet-api",
        "sh",
        "-c",
        "echo \"$API_TOKEN\"; stat -c '%a %u' /run/secrets/cert.pem; cat /run/secrets/cert.pem",
    ]);
    let mut lines = seen.lines();
    assert_eq!(lines.next(), Some(TOKEN), "{seen}");
    assert_eq!(lines.next(), Some("400 1000"), "{seen}");
    assert_eq!(lines.collect::<Vec<_>>().join("\n") + "\n", CERT, "{seen}");
    let first = id_state(&rig, "api");
    let first_names = podman_secrets(&rig);
    assert_eq!(first_names.len(), 2, "{first_names:?}");

    // A rotation the device has not received yet: nothing is touched.
    put_desired(&rig, 2, vec![with_secrets("12")]);
    let failed = eventually(
        &agent,
        Duration::from_secs(30),
        "api secret-missing",
        || status_of(&rig, 2, "api").filter(|s| s.state == WorkloadState::Failed),
    );
    assert_eq!(
        failed.error.as_ref().map(|e| e.as_str()),
        Some("secret-missing: Secret api-credentials key token version 12 not delivered yet")
    );
    assert_eq!(
        failed.failure.as_ref().map(|f| f.reason),
        Some(FailureReason::SecretMissing)
    );
    assert_eq!(
        id_state(&rig, "api"),
        first,
        "the running container is untouched"
    );

    // Delivered: the next pass replaces the container, and the old version's Podman secrets go.
    put_values("12");
    eventually(
        &agent,
        Duration::from_secs(20),
        "api running version 12",
        || (status_of(&rig, 2, "api")?.state == WorkloadState::Running).then_some(()),
    );
    assert_ne!(id_state(&rig, "api"), first);
    let want: BTreeMap<String, ()> = with_secrets("12")
        .secrets
        .iter()
        .map(|u| (u.podman_name(&WorkloadName::try_from("api").unwrap()), ()))
        .collect();
    let want: Vec<String> = want.into_keys().collect();
    eventually(
        &agent,
        Duration::from_secs(20),
        "old Podman secrets removed",
        || (podman_secrets(&rig) == want).then_some(()),
    );

    // A new version whose container does not start: the old one runs again, and the secrets it uses stay
    // through the clean-up of this and later passes (Podman would delete them, and it could not start again).
    put_values("13");
    let mut broken = with_secrets("13");
    broken.command = vec!["/no/such/program".into()];
    put_desired(&rig, 3, vec![broken]);
    let failed = eventually(&agent, Duration::from_secs(30), "api start failed", || {
        status_of(&rig, 3, "api").filter(|s| s.state == WorkloadState::Failed)
    });
    assert_eq!(
        failed.failure.as_ref().map(|f| (f.reason, f.rolled_back)),
        Some((FailureReason::StartFailed, true))
    );
    let restored = id_state(&rig, "api");
    // Two more passes (resyncs, each after the failed pass and its clean-up of unused secrets) left it alone.
    let held = "api: the failed spec waits for its retry";
    let seen = agent.log_text().matches(held).count();
    eventually(&agent, Duration::from_secs(30), "two more passes", || {
        (agent.log_text().matches(held).count() >= seen + 2).then_some(())
    });
    let names = podman_secrets(&rig);
    assert!(
        want.iter().all(|n| names.contains(n)),
        "the running container's secrets were removed: {names:?}"
    );
    p.podman(&["restart", "-t", "0", "fleet-api"]);
    let again = p.podman(&["exec", "fleet-api", "sh", "-c", "echo \"$API_TOKEN\""]);
    assert_eq!(again, TOKEN);
    assert_eq!(
        id_state(&rig, "api").split(' ').next(),
        restored.split(' ').next()
    );

    // Removing the workload removes its secrets.
    put_desired(&rig, 4, vec![]);
    eventually(
        &agent,
        Duration::from_secs(20),
        "secrets of a removed workload removed",
        || podman_secrets(&rig).is_empty().then_some(()),
    );
    assert_nothing_leaked(
        &rig,
        &agent,
        &[TOKEN, CERT.trim(), "c2VjcmV0LWNlcnQtYm9keQ=="],
    );
    agent.sigterm();
    assert!(agent.wait_exit(Duration::from_secs(30)).success());
}
