//! The attacks of `auth_attacks` as the fleet runs (issue "One device can never harm another", docs/auth.md threat
//! model): nats-server with the fleet-auth callout **over TLS** with a private CA (the rig's `FleetNats`, as the
//! whole-device tests and the demo start it: the real fleet-auth and a Zitadel stand-in), the operator against the
//! real kube-apiserver, attackers holding one device's valid token (async-nats), and a real agent as the victim
//! where its side matters. After each attack: every other device's keys unchanged (revision and value), the victim
//! agent connected throughout (no reconnect in its log, the process never exited), the attacker's own writes
//! refused once over its share, and the operator showing it on the attacker's Device only (`status.writesRefused`,
//! a `WritesRefused` event).
//!
//! One server, operator and API server for the binary (the operator's TLS settings are per process); each test
//! uses device ids of its own.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../auth/tests/auth_common/mod.rs"]
mod auth_common;
mod kube_common;

use async_nats::jetstream;
use fleet_operator::crd::Device;
use fleet_rig::callout::FleetNats;
use fleet_wire::kv;
use k8s_openapi::api::core::v1::Event;
use kube::api::{Api, ListParams, PostParams};
use kube_common::eventually;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The binary's world: the TLS server with the callout, the operator, its runtime.
struct World {
    rt: tokio::runtime::Runtime,
    nats: FleetNats,
    kube: kube::Client,
    js: jetstream::Context,
    run: String,
}

fn world() -> &'static World {
    static W: OnceLock<World> = OnceLock::new();
    W.get_or_init(|| {
        let nats = auth_common::fleet_nats_tls();
        let ca = nats.ca_file().expect("TLS").to_owned();
        let settings = fleet_operator::kv::NatsSettings {
            tls: fleet_operator::nats_tls::NatsTls::new(Some(ca), None, None, "--nats-")
                .expect("tls"),
            buckets: Default::default(),
        };
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        let run = format!("attacks-tls-{}", std::process::id());
        let (kube, js) = rt.block_on(async {
            let kube = kube_common::client().await;
            let (_c, js) = fleet_operator::kv::connect(&nats.service_url(), &settings.tls)
                .await
                .expect("the services' user connects over TLS");
            fleet_operator::kv::ensure_buckets(&js, &Default::default())
                .await
                .expect("buckets");
            let opts = fleet_operator::deployments::engine::Options {
                nats_url: nats.service_url(),
                instance: Some("op-tls".into()),
                label_selector: Some(format!("fleet-test={run}")),
                nats: settings.clone(),
                secrets_namespace: None,
            };
            kube_common::spawn_engine(kube.clone(), opts);
            (kube, js)
        });
        World {
            rt,
            nats,
            kube,
            js,
            run,
        }
    })
}

impl World {
    /// A device id of this test (`<base>-<pid>`) with its Device (labelled for the operator).
    fn device(&self, base: &str) -> String {
        let id = format!("{base}-{}", std::process::id());
        let d: Device = serde_json::from_value(serde_json::json!({
            "apiVersion": "fleet.nationtech.io/v1alpha1", "kind": "Device",
            "metadata": {"name": id, "labels": {"fleet-test": self.run}}, "spec": {}
        }))
        .unwrap();
        self.rt.block_on(async {
            let api: Api<Device> = Api::all(self.kube.clone());
            match api.create(&PostParams::default(), &d).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 409 => {}
                Err(e) => panic!("Device {id}: {e}"),
            }
        });
        id
    }

    /// An attacker's connection with `device`'s valid token over TLS.
    fn connect(&self, device: &str) -> async_nats::Client {
        let token = self.nats.device_token(device).expect("callout on");
        let ca = self.nats.ca_file().expect("TLS").to_owned();
        let url = self.nats.url();
        let device = device.to_owned();
        self.rt.block_on(async move {
            async_nats::ConnectOptions::with_token(token.expose().to_owned())
                .name("attacker")
                .custom_inbox_prefix(format!("_INBOX.device.{device}"))
                .add_root_certificates(ca)
                .require_tls(true)
                .connection_timeout(Duration::from_secs(5))
                .connect(url)
                .await
                .unwrap_or_else(|e| panic!("{device} connects over TLS: {e}"))
        })
    }

    fn store(&self, bucket: &str) -> jetstream::kv::Store {
        self.rt.block_on(self.store_async(bucket))
    }

    async fn store_async(&self, bucket: &str) -> jetstream::kv::Store {
        self.js.get_key_value(bucket).await.expect("bucket")
    }

    fn put(&self, bucket: &str, key: &str, value: Vec<u8>) {
        self.rt
            .block_on(self.store(bucket).put(key, value.into()))
            .unwrap_or_else(|e| panic!("put {bucket}/{key}: {e}"));
    }

    /// A bystander with a key in every bucket keyed by device (written as the operator would).
    fn bystander(&self, base: &str) -> Bystander {
        let id = format!("{base}-{}", std::process::id());
        for spec in kv::BUCKETS {
            if let Some(key) = Bystander::key(&id, spec) {
                self.put(
                    spec.name,
                    &key,
                    format!("{id}'s {} value", spec.name).into_bytes(),
                );
            }
        }
        Bystander { id }
    }

    /// The Device's `status.writesRefused`, once set.
    fn shows_refused(&self, device: &str) -> fleet_operator::crd::WritesRefused {
        self.rt.block_on(eventually(
            &format!("{device}'s Device shows writesRefused"),
            || async {
                Api::<Device>::all(self.kube.clone())
                    .get(device)
                    .await
                    .ok()?
                    .status?
                    .writes_refused
            },
        ))
    }

    fn refused_events(&self, device: &str) -> Vec<Event> {
        self.rt.block_on(self.refused_events_async(device))
    }

    async fn refused_events_async(&self, device: &str) -> Vec<Event> {
        Api::<Event>::namespaced(self.kube.clone(), "default")
            .list(&ListParams::default().fields(&format!("involvedObject.name={device}")))
            .await
            .map(|l| l.items)
            .unwrap_or_default()
            .into_iter()
            .filter(|e| e.reason.as_deref() == Some("WritesRefused"))
            .collect()
    }

    /// The operator showed `attacker`'s refusals (status naming `bucket`, the latest refused write's, and a
    /// `WritesRefused` event), and nothing on `others`.
    fn operator_shows(&self, attacker: &str, bucket: &str, others: &[&str]) {
        let shown = self.rt.block_on(eventually(
            &format!("{attacker}'s Device shows refusals in {bucket}"),
            || async {
                Api::<Device>::all(self.kube.clone())
                    .get(attacker)
                    .await
                    .ok()?
                    .status?
                    .writes_refused
                    .filter(|s| s.bucket.as_deref() == Some(bucket))
            },
        ));
        assert!(shown.count > 0, "{shown:?}");
        let ev = self.rt.block_on(eventually(
            &format!("a WritesRefused event on {attacker}"),
            || async { self.refused_events_async(attacker).await.into_iter().next() },
        ));
        let text = ev.message.unwrap_or_default();
        assert!(
            text.contains(&format!("of device {attacker} (latest: "))
                && text.contains(" refused since "),
            "{text}"
        );
        let events = self.refused_events(attacker);
        assert!(
            events.len() <= 2,
            "{} events: one per device per 5 minutes",
            events.len()
        );
        for other in others {
            let s = self
                .rt
                .block_on(Api::<Device>::all(self.kube.clone()).get(other))
                .ok()
                .and_then(|d| d.status)
                .and_then(|s| s.writes_refused);
            assert_eq!(s, None, "{other} shows refusals it never made");
            assert!(
                self.refused_events(other).is_empty(),
                "{other} has WritesRefused events"
            );
        }
        println!("{attacker}: {} refused, event: {text}", shown.count);
    }
}

/// A device that is never connected, with a key in every bucket keyed by device.
struct Bystander {
    id: String,
}

impl Bystander {
    fn key(id: &str, spec: &kv::BucketSpec) -> Option<String> {
        match spec.key {
            kv::KeyShape::Device => Some(id.to_owned()),
            kv::KeyShape::DeviceRun => Some(format!("{id}.{RUN_C}")),
            _ => None,
        }
    }

    /// Every key: bucket → (revision, value); fails when one is gone or deleted.
    fn keys(&self, w: &World) -> BTreeMap<&'static str, (u64, Vec<u8>)> {
        kv::BUCKETS
            .iter()
            .filter_map(|spec| {
                let key = Self::key(&self.id, spec)?;
                let e =
                    w.rt.block_on(w.store(spec.name).entry(key))
                        .expect("read")
                        .unwrap_or_else(|| panic!("{}'s key in {} is gone", self.id, spec.name));
                assert_eq!(
                    e.operation,
                    jetstream::kv::Operation::Put,
                    "{}'s key in {} was deleted or purged",
                    self.id,
                    spec.name
                );
                Some((spec.name, (e.revision, e.value.to_vec())))
            })
            .collect()
    }
}

const RUN_C: &str = "3c1e0a5b-8f2d-4b7a-9c6e-1d2f3a4b5c6d";
const RUN_A: &str = "0a5b3c1e-8f2d-4b7a-9c6e-1d2f3a4b5c6d";

/// A request (own inbox, through the device API or JetStream); the answer's text, empty on time-out.
fn ask(
    w: &World,
    c: &async_nats::Client,
    subject: String,
    headers: Option<async_nats::HeaderMap>,
    body: Vec<u8>,
) -> String {
    w.rt.block_on(async {
        let req = match headers {
            Some(h) => c.request_with_headers(subject, h, body.into()).await,
            None => c.request(subject, body.into()).await,
        };
        req.map(|m| String::from_utf8_lossy(&m.payload).into_owned())
            .unwrap_or_default()
    })
}

/// Writes past the attacker's share (300 at once, three times its budget's burst): some must be refused.
fn go_over_share(w: &World, c: &async_nats::Client, attacker: &str) {
    use futures::StreamExt;
    let (taken, refused) = w.rt.block_on(async {
        let inbox = format!("_INBOX.device.{attacker}.flood");
        let mut answers = c.subscribe(inbox.clone()).await.expect("own inbox");
        for _ in 0..300 {
            c.publish_with_reply(
                format!("$KV.device-heartbeat.{attacker}"),
                inbox.clone(),
                "{}".into(),
            )
            .await
            .expect("publish");
        }
        c.flush().await.expect("flush");
        let (mut taken, mut refused) = (0, 0);
        while taken + refused < 300 {
            match tokio::time::timeout(Duration::from_secs(10), answers.next()).await {
                Ok(Some(m)) if m.payload.windows(5).any(|x| x == b"\"seq\"") => taken += 1,
                Ok(Some(m)) if m.payload.windows(12).any(|x| x == b"write budget") => refused += 1,
                Ok(Some(_)) => {}
                _ => break,
            }
        }
        (taken, refused)
    });
    assert!(
        refused > 0,
        "300 writes at once: {taken} taken, none refused"
    );
}

/// A real fleet-agent over TLS with its token file (Podman off); killed on drop.
struct Victim {
    child: Child,
    log: PathBuf,
    _root: tempfile::TempDir,
}

impl Victim {
    fn start(w: &World, device: &str, resync_secs: u64) -> Self {
        let root = tempfile::Builder::new()
            .prefix("fleet-victim-")
            .tempdir()
            .expect("root");
        std::fs::create_dir_all(root.path().join("etc")).expect("etc");
        std::fs::write(
            root.path().join("etc/os-release"),
            "ID=debian\nVERSION_ID=\"12\"\nPRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\n",
        )
        .expect("os-release");
        auth_common::updater_peer(&fleet_wire::socket::updater_socket(root.path()));
        let token = root.path().join("nats.token");
        auth_common::write_token(&token, w.nats.device_token(device).expect("token").expose());
        let config = root.path().join("agent.toml");
        std::fs::write(
            &config,
            format!(
                "device_id = \"{device}\"\nroot = \"{root}\"\n[nats]\nurls = [\"{url}\"]\ntoken_file = \"{token}\"\n\
                 ca_file = \"{ca}\"\nconnect_timeout_secs = 2\nretry_window_secs = 60\n[intervals]\n\
                 heartbeat_secs = 1\nstatus_secs = 1\nresync_secs = {resync_secs}\nupdater_poll_ms = 200\n\
                 [podman]\nenabled = false\n",
                root = root.path().display(),
                url = w.nats.url(),
                token = token.display(),
                ca = w.nats.ca_file().expect("TLS").display(),
            ),
        )
        .expect("agent.toml");
        let log = root.path().join("agent.log");
        let child = Command::new(fleet_vm_tests::builds::agent(fleet_vm_tests::builds::V1))
            .arg("--config")
            .arg(&config)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log"))
            .spawn()
            .expect("spawn fleet-agent");
        Self {
            child,
            log,
            _root: root,
        }
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn saw(&self, generation: u64, within: Duration) -> bool {
        fleet_rig::wait_for(within, || {
            self.log_text()
                .contains(&format!("desired state generation {generation}"))
                .then_some(())
        })
        .is_some()
    }

    /// Connected throughout: no disconnect, reconnect or slow consumer in its log, and still running.
    fn assert_undisturbed(&mut self) {
        let log = self.log_text();
        for bad in ["disconnected", "reconnect", "slow consumer"] {
            assert!(
                !log.to_lowercase().contains(bad),
                "the victim's log shows {bad:?}:\n{log}"
            );
        }
        assert!(
            self.child.try_wait().expect("wait").is_none(),
            "the victim agent exited:\n{log}"
        );
    }
}

impl Drop for Victim {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn put_desired(w: &World, device: &str, generation: u64) {
    let d = fleet_wire::DesiredState::new(
        fleet_wire::DeviceId::try_from(device).unwrap(),
        generation,
        Vec::new(),
    )
    .unwrap();
    w.put(kv::DESIRED_STATE, device, serde_json::to_vec(&d).unwrap());
}

#[test]
fn over_tls_no_header_on_a_devices_write_changes_another_devices_keys() {
    let w = world();
    let attacker = w.device("tlsha");
    let by = w.bystander("tlshc");
    w.put(
        kv::SYSTEM_UPGRADE_INTENT,
        &format!("{attacker}.{RUN_A}"),
        b"{}".to_vec(),
    );
    let before = by.keys(w);
    let a = w.connect(&attacker);
    let header_sets: Vec<Vec<(&str, String)>> = vec![
        vec![("Nats-Rollup", "all".into())],
        vec![("Nats-Rollup", "sub".into())],
        vec![
            ("KV-Operation", "PURGE".into()),
            ("Nats-Rollup", "sub".into()),
        ],
        vec![
            ("KV-Operation", "PURGE".into()),
            ("Nats-Rollup", "all".into()),
        ],
        vec![("KV-Operation", "DEL".into())],
        vec![("Nats-Expected-Stream", "STREAM".into())],
        vec![("Nats-Expected-Last-Sequence", "0".into())],
        vec![("Nats-Expected-Last-Subject-Sequence", "0".into())],
        vec![("Nats-Expected-Last-Msg-Id", "x".into())],
        vec![("Nats-Msg-Id", "next".into())],
        vec![("Nats-TTL", "1s".into())],
        vec![("Nats-Incr", "1".into())],
        vec![
            ("Nats-Batch-Id", "b1".into()),
            ("Nats-Batch-Sequence", "1".into()),
            ("Nats-Batch-Commit", "1".into()),
        ],
        vec![
            ("Nats-Schedule", "@every 1s".into()),
            ("Nats-Schedule-Target", "BYSTANDER".into()),
        ],
        vec![("Nats-Required-Api-Level", "0".into())],
    ];
    let mut answers = Vec::new();
    for spec in fleet_wire::device_api::written_buckets() {
        let own = match spec.key {
            kv::KeyShape::Device => format!("$KV.{}.{attacker}", spec.name),
            _ => format!("$KV.{}.{attacker}.{RUN_A}", spec.name),
        };
        for set in &header_sets {
            let mut h = async_nats::HeaderMap::new();
            for (k, v) in set {
                let v = match v.as_str() {
                    "BYSTANDER" => format!("$KV.{}.{}", spec.name, by.id),
                    "STREAM" => format!("KV_{}", spec.name),
                    _ => v.clone(),
                };
                h.insert(*k, v.as_str());
            }
            answers.push((
                own.clone(),
                format!("{set:?}"),
                ask(w, &a, own.clone(), Some(h), b"{}".to_vec()),
            ));
        }
    }
    // why: a write that did nothing shows no event; the window outlasts any schedule or TTL the writes could set
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(
        before,
        by.keys(w),
        "a header on {attacker}'s own writes changed {}'s keys; the answers were:\n{answers:#?}",
        by.id
    );
    go_over_share(w, &a, &attacker);
    assert_eq!(before, by.keys(w), "the flood changed {}'s keys", by.id);
    w.operator_shows(&attacker, kv::DEVICE_HEARTBEAT, &[&by.id]);
}

/// The whole-fleet flood: 60 s of direct gets of the attacker's largest readable value, refused writes and watch
/// registrations, each with the reply subject aimed at the victim's watch subjects and inboxes, as fast as one
/// client sends over TLS (13,000-37,000 messages a second before the flood guard: the victim was never
/// disconnected but 3-6 of its 12 changes came later than 5 s). fleet-auth's flood guard disconnects the attacker
/// within two polls and refuses it for the cool-down; the victim sees every change in time, and the operator
/// shows the attacker (and no one else) cut off.
#[test]
fn over_tls_a_flooding_device_is_cut_off_and_its_answers_aimed_at_another_device_reach_nothing_for_60_seconds(
) {
    let w = world();
    let attacker = w.device("tlsra");
    let victim_id = w.device("tlsrb");
    // The victim re-reads its keys only every 10 minutes: a change reaches it in time only through its watch.
    let mut victim = Victim::start(w, &victim_id, 600);
    put_desired(w, &victim_id, 1);
    assert!(
        victim.saw(1, Duration::from_secs(30)),
        "victim never started:\n{}\n{}",
        victim.log_text(),
        w.nats.auth_logs()
    );
    let a = w.connect(&attacker);
    let spec = auth_common::largest_readable_own_bucket();
    let own = format!("$KV.{}.{attacker}", spec.name);
    let big = vec![b'x'; spec.max_value_bytes as usize];
    let stored = ask(w, &a, own.clone(), None, big);
    assert!(
        stored.contains("\"seq\""),
        "the attacker's own large value: {stored}"
    );
    // What it only writes it cannot read back: its 96 KiB of workload status is no ammunition.
    let status = format!("$KV.device-workload-status.{attacker}");
    let stored = ask(w, &a, status.clone(), None, vec![b'x'; 96 * 1024]);
    assert!(stored.contains("\"seq\""), "{stored}");
    let read_back = ask(
        w,
        &a,
        fleet_wire::auth::direct_get_subject(kv::WORKLOAD_STATUS, &status),
        None,
        Vec::new(),
    );
    assert!(
        read_back.is_empty(),
        "a device read its write-only workload status back: {read_back:.80}"
    );
    let get = fleet_wire::auth::direct_get_subject(spec.name, &own);
    let v = &victim_id;
    let targets = [
        format!("$KV.device-desired-state.{v}"),
        format!("$KV.agent-upgrade-intent.{v}"),
        format!("$KV.system-upgrade-intent.{v}.x"),
        format!("_INBOX.device.{v}"),
        format!("_INBOX.device.{v}.>"),
        format!("_INBOX.device.{v}.*.1"),
        format!("_INBOX.device.{v}.x.device-desired-state.{v}"),
    ];
    let registration = format!(r#"{{"inbox":"_INBOX.device.{v}.AbCdEfGhIjKlMnOpQrStUv"}}"#);
    let started = Instant::now();
    let (mut sent, mut generation, mut missed) = (0u64, 1u64, Vec::new());
    let mut last_change = Instant::now();
    while started.elapsed() < Duration::from_secs(60) {
        // Bounded: once the attacker is cut off its client buffers (then blocks) until it is let back in.
        w.rt.block_on(async {
            let round = async {
                for t in &targets {
                    for _ in 0..20 {
                        let _ = a
                            .publish_with_reply(get.clone(), t.clone(), "".into())
                            .await;
                        let _ = a
                            .publish_with_reply(
                                format!("$KV.device-heartbeat.{attacker}"),
                                t.clone(),
                                "{}".into(),
                            )
                            .await;
                        sent += 2;
                    }
                    let _ = a
                        .publish_with_reply(
                            format!("fleet.device-watch.{attacker}"),
                            t.clone(),
                            registration.clone().into(),
                        )
                        .await;
                }
                let _ = a.flush().await;
            };
            let _ = tokio::time::timeout(Duration::from_secs(2), round).await;
        });
        if last_change.elapsed() >= Duration::from_secs(5) {
            generation += 1;
            put_desired(w, &victim_id, generation);
            if !victim.saw(generation, Duration::from_secs(5)) {
                missed.push(generation);
            }
            last_change = Instant::now();
        }
    }
    assert!(
        missed.is_empty(),
        "the victim missed desired-state changes {missed:?} during the attack ({sent} messages queued):\n{}\n{}",
        victim.log_text(),
        w.nats.auth_logs()
    );
    victim.assert_undisturbed();
    // The attacker was cut off, and its sessions refused while it cooled down.
    let logs = w.nats.auth_logs();
    let cut = format!("flood guard: device {attacker} (cid ");
    assert!(
        logs.contains(&cut) && logs.contains("disconnected: "),
        "fleet-auth never cut {attacker} off:\n{logs}"
    );
    assert!(
        logs.contains(&format!(
            "device {attacker} is cooling down after a message flood"
        )),
        "{attacker}'s reconnects were not refused while it cooled down:\n{logs}"
    );
    assert!(
        !logs.contains(&format!("flood guard: device {victim_id} ")),
        "the victim was cut off:\n{logs}"
    );
    // The operator shows it on the attacker's Device only: status (kind flood) and a WritesRefused event.
    let refused = || {
        w.rt.block_on(Api::<Device>::all(w.kube.clone()).get(&attacker))
            .ok()
            .and_then(|d| d.status?.writes_refused)
    };
    let shown = fleet_rig::wait_for(Duration::from_secs(60), || {
        refused().filter(|s| s.kind == fleet_wire::device_api::FLOOD_KIND)
    })
    .unwrap_or_else(|| {
        panic!(
            "{attacker}'s Device does not show the flood: {:?}\n{}",
            refused(),
            w.nats.auth_logs()
        )
    });
    assert!(shown.reason.contains("messages a second"), "{shown:?}");
    let ev = w.rt.block_on(eventually(
        &format!("a flood event on {attacker}"),
        || async {
            w.refused_events_async(&attacker)
                .await
                .into_iter()
                .find(|e| {
                    e.message
                        .as_deref()
                        .unwrap_or("")
                        .contains("flood guard cut off")
                })
        },
    ));
    let none: Option<fleet_operator::crd::WritesRefused> =
        w.rt.block_on(Api::<Device>::all(w.kube.clone()).get(&victim_id))
            .ok()
            .and_then(|d| d.status)
            .and_then(|s| s.writes_refused);
    assert_eq!(none, None, "the victim shows refusals it never made");
    println!(
        "{sent} attack messages queued in 60 s over TLS; the victim noticed {generation} generations, none missed; \
         event: {}",
        ev.message.unwrap_or_default()
    );
}

#[test]
fn over_tls_floods_are_refused_past_the_devices_share_and_shown() {
    let w = world();
    let attacker = w.device("tlsfa");
    let victim_id = w.device("tlsfb");
    let by = w.bystander("tlsfc");
    w.put(
        kv::SYSTEM_UPGRADE_INTENT,
        &format!("{attacker}.{RUN_A}"),
        b"{}".to_vec(),
    );
    let mut victim = Victim::start(w, &victim_id, 2);
    let victim_info = || {
        w.rt.block_on(w.store(kv::DEVICE_INFO).entry(victim_id.clone()))
            .ok()
            .flatten()
            .map(|e| (e.revision, e.value.to_vec()))
    };
    let info = fleet_rig::wait_for(Duration::from_secs(30), victim_info)
        .unwrap_or_else(|| panic!("the victim never wrote its info:\n{}", victim.log_text()));
    let before = by.keys(w);
    let a = w.connect(&attacker);

    // Run keys: only the given run is written; random runs (60 KiB each) and other suffixes are refused.
    let given = ask(
        w,
        &a,
        format!("$KV.system-upgrade-status.{attacker}.{RUN_A}"),
        None,
        b"{}".to_vec(),
    );
    assert!(given.contains("\"seq\""), "the given run's status: {given}");
    for i in 0..50 {
        let run = fleet_wire::AttemptId::new_random();
        let answer = ask(
            w,
            &a,
            format!("$KV.system-upgrade-status.{attacker}.{run}"),
            None,
            vec![b'x'; 60 * 1024],
        );
        assert!(
            answer.contains("no intent for run") || answer.contains("limit"),
            "run key {i} ({run}) was not refused: {answer}"
        );
        let answer = ask(
            w,
            &a,
            format!("$KV.system-upgrade-status.{attacker}.x{i}"),
            None,
            b"{}".to_vec(),
        );
        assert!(answer.contains("invalid key"), "suffix x{i}: {answer}");
    }
    let keys: Vec<String> = w.rt.block_on(async {
        use futures::TryStreamExt;
        w.store_async(kv::SYSTEM_UPGRADE_STATUS)
            .await
            .keys()
            .await
            .expect("keys")
            .try_collect::<Vec<String>>()
            .await
            .expect("keys")
    });
    let own: Vec<_> = keys
        .iter()
        .filter(|k| k.starts_with(&format!("{attacker}.")))
        .collect();
    assert_eq!(
        own,
        [&format!("{attacker}.{RUN_A}")],
        "only the given run's key"
    );

    // Oversize values: refused with the limit named.
    let limit = kv::bucket(kv::DEVICE_INFO).unwrap().max_value_bytes as usize;
    let answer = ask(
        w,
        &a,
        format!("$KV.device-info.{attacker}"),
        None,
        vec![b'x'; limit + 1],
    );
    assert!(answer.contains("over device-info's limit"), "{answer}");

    // A write flood: the budget's burst, then refusals.
    go_over_share(w, &a, &attacker);

    assert_eq!(before, by.keys(w), "the floods changed {}'s keys", by.id);
    // The victim's own info was not touched by the attacker (it may have rewritten it itself: compare values).
    let after = victim_info().expect("the victim's info is there");
    assert!(after.0 >= info.0, "revision went back");
    victim.assert_undisturbed();
    w.operator_shows(&attacker, kv::DEVICE_HEARTBEAT, &[&victim_id, &by.id]);
    let shown = w.shows_refused(&attacker);
    assert!(
        shown.count >= 50,
        "{shown:?}: at least the 50 run keys and 50 suffixes"
    );
}

/// fleet-auth's own log (the rig's `auth_logs` holds nats-server's after it).
fn fleet_auth_log(w: &World) -> String {
    let all = w.nats.auth_logs();
    let own = all.split("--- nats-server ---").next().unwrap_or("");
    own.to_owned()
}

/// A device that floods refused watch registrations whose text carries newlines costs
/// fleet-auth's log one line per device per interval (10 s), with the count, and writes no line of its own.
#[test]
fn over_tls_a_flood_of_refused_registrations_costs_the_log_a_line_per_interval_and_forges_none() {
    let w = world();
    let attacker = w.device("tlslog");
    let victim = format!("tlslogv-{}", std::process::id());
    let marker = format!("FORGED-{}", std::process::id());
    let forged = format!(
        "[2026-12-07T04:00:00Z WARN  fleet_auth::flood_guard] flood guard: device {victim} (cid 1 on server X) \
         sent 9999 messages in 1 s {marker}"
    );
    let body = serde_json::to_vec(&serde_json::json!({ format!("x\n{forged}\n"): 1 })).unwrap();
    let before = fleet_auth_log(w).lines().count();
    let a = w.connect(&attacker);
    let subject = format!("fleet.device-watch.{attacker}");
    let started = Instant::now();
    // 4 s of registrations as fast as the client takes them (once the flood guard cuts the connection off, the
    // client holds them until it is let back in).
    let sent = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    w.rt.block_on(async {
        let flood = async {
            loop {
                for _ in 0..500 {
                    if a.publish(subject.clone(), body.clone().into())
                        .await
                        .is_ok()
                    {
                        sent.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                }
                let _ = tokio::time::timeout(Duration::from_millis(200), a.flush()).await;
            }
        };
        let _ = tokio::time::timeout(Duration::from_secs(4), flood).await;
    });
    let sent = sent.load(std::sync::atomic::Ordering::Relaxed);
    // The summary of the flood comes within an interval of its first line.
    let summary = fleet_rig::wait_for(Duration::from_secs(25), || {
        fleet_auth_log(w)
            .lines()
            .skip(before)
            .find(|l| {
                l.contains(&format!("watch registration refused for {attacker}: "))
                    && l.contains(" more in the last ")
            })
            .map(str::to_owned)
    });
    let elapsed = started.elapsed();
    let log = fleet_auth_log(w);
    let new: Vec<&str> = log.lines().skip(before).collect();
    let registrations: Vec<&&str> = new
        .iter()
        .filter(|l| l.contains("watch registration") && l.contains(&attacker))
        .collect();
    let naming: Vec<&&str> = new.iter().filter(|l| l.contains(&attacker)).collect();
    println!(
        "{sent} refused registrations sent in 4 s; fleet-auth wrote {} lines in {:.1} s, {} naming {attacker}, {} \
         about its registrations, {} about its refused connections, {} bytes; summary: {summary:?}",
        new.len(),
        elapsed.as_secs_f64(),
        naming.len(),
        registrations.len(),
        naming.iter().filter(|l| l.contains("denied client")).count(),
        new.iter().map(|l| l.len() + 1).sum::<usize>()
    );
    // env_logger indents a message's further lines by four spaces; a reader of the journal sees them as lines.
    let forgeries: Vec<&&str> = new
        .iter()
        .filter(|l| l.trim_start().starts_with(&forged[..40]))
        .collect();
    assert!(
        forgeries.is_empty(),
        "{} forged lines in fleet-auth's log, e.g. {:?}",
        forgeries.len(),
        forgeries.first()
    );
    let raw = new
        .iter()
        .find(|l| l.contains(&marker) && !l.contains("\\n[2026-12-07T04:00:00Z"));
    assert_eq!(raw, None, "the device's text is not shown escaped");
    // At most one line per interval (10 s) from the first, plus the first.
    let bound = 2 + elapsed.as_secs() as usize / 10;
    assert!(
        registrations.len() <= bound,
        "{} lines about {attacker}'s registrations in {:.1} s (at most {bound}): {:?}",
        registrations.len(),
        elapsed.as_secs_f64(),
        &registrations[..registrations.len().min(5)]
    );
    // Its client reconnecting while it cools down: refused each time, one line per interval too.
    let denied = naming
        .iter()
        .filter(|l| l.contains("denied client"))
        .count();
    assert!(
        denied <= bound,
        "{denied} lines about {attacker}'s refused connections in {:.1} s (at most {bound})",
        elapsed.as_secs_f64()
    );
    let summary = summary.unwrap_or_else(|| panic!("no summary of the flood: {registrations:?}"));
    assert!(sent > 1_000, "the flood: {sent} messages");
    assert!(summary.contains("watch registration refused"), "{summary}");
}

/// A write's acknowledgement tells a device nothing of other devices' writes (JetStream's
/// stream sequence counts every device's), and keeps the shape the agent (this release's and the previous one's:
/// both require a numeric `seq` and only log it) reads.
#[test]
fn over_tls_a_devices_acknowledgements_tell_nothing_of_another_devices_writes() {
    let w = world();
    let (a_id, b_id) = (w.device("tlsacka"), w.device("tlsackb"));
    let (a, b) = (w.connect(&a_id), w.connect(&b_id));
    let ack = |c: &async_nats::Client, device: &str| -> serde_json::Value {
        let text = ask(
            w,
            c,
            format!("$KV.device-heartbeat.{device}"),
            None,
            b"{}".to_vec(),
        );
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("ack {text:?}: {e}"))
    };
    let seq = |v: &serde_json::Value| {
        v["seq"]
            .as_u64()
            .unwrap_or_else(|| panic!("the agent needs a numeric seq: {v}"))
    };
    let first = ack(&a, &a_id);
    for _ in 0..5 {
        ack(&b, &b_id);
    }
    let second = ack(&a, &a_id);
    let revision =
        w.rt.block_on(w.store(kv::DEVICE_HEARTBEAT).entry(a_id.clone()))
            .expect("read")
            .expect("a's heartbeat")
            .revision;
    println!("{a_id}'s acks around five writes of {b_id}: {first} then {second} (its key's revision {revision})");
    assert!(
        first.get("error").is_none() && second.get("error").is_none(),
        "{first} {second}"
    );
    assert!(
        seq(&second).abs_diff(seq(&first)) <= 1,
        "the gap between two of {a_id}'s acks counts {b_id}'s writes: {first} then {second}"
    );
    assert_ne!(
        seq(&second),
        revision,
        "the ack carries the stream's sequence (every device's writes)"
    );
}
