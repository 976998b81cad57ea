//! The committed deploy manifests match the code: `deploy/crds.yaml` is exactly what `crdgen` prints, and the
//! RBAC rules cover every CRD and its status subresource.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

fn read(name: &str) -> String {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("deploy")
        .join(name);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

#[test]
fn crds_yaml_matches_crdgen() {
    let generated = fleet_operator::deploy::crds_yaml().expect("yaml");
    assert!(
        read("crds.yaml") == generated,
        "operator/deploy/crds.yaml is stale: run `cargo run -p fleet-operator --bin crdgen > operator/deploy/crds.yaml`"
    );
}

#[test]
fn rbac_covers_every_crd() {
    let rbac = read("rbac.yaml");
    for crd in fleet_operator::crd::all_crds() {
        assert_eq!(crd.spec.group, fleet_operator::crd::GROUP);
        let plural = &crd.spec.names.plural;
        assert!(
            rbac.contains(&format!("\"{plural}\"")),
            "rbac.yaml lacks {plural}"
        );
        let v = &crd.spec.versions[0];
        // A WorkloadPolicy is read, never written: nothing about it is observed (an invalid one is refused by the
        // webhook and named in the messages of the deployments it would apply to).
        if crd.spec.names.kind != "WorkloadPolicy" {
            assert!(
                rbac.contains(&format!("\"{plural}/status\"")),
                "rbac.yaml lacks {plural}/status"
            );
            assert!(
                v.subresources
                    .as_ref()
                    .and_then(|s| s.status.as_ref())
                    .is_some(),
                "{plural} has a status subresource"
            );
        }
        assert!(
            !v.additional_printer_columns
                .as_ref()
                .is_none_or(|c| c.is_empty()),
            "{plural} has printer columns"
        );
    }
    let deployment = read("deployment.yaml");
    assert!(deployment.contains("serviceAccountName: fleet-operator"));
}

/// The unknown-field webhook covers every fleet kind, on create and update, at the path the operator serves.
#[test]
fn fields_webhook_covers_every_crd() {
    use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
    let manifest = read("webhook.yaml");
    let doc = manifest
        .split("\n---\n")
        .find(|d| d.contains("kind: ValidatingWebhookConfiguration"))
        .expect("webhook configuration");
    let config: ValidatingWebhookConfiguration = serde_yaml_ng::from_str(doc).expect("yaml");
    let hooks = config.webhooks.expect("webhooks");
    let hook = hooks
        .iter()
        .find(|h| {
            h.client_config
                .service
                .as_ref()
                .and_then(|s| s.path.as_deref())
                == Some(fleet_operator::webhook::FIELDS_PATH)
        })
        .expect("a hook on the fields path");
    let rules = hook.rules.as_ref().expect("rules");
    for crd in fleet_operator::crd::all_crds() {
        let plural = &crd.spec.names.plural;
        assert!(
            rules.iter().any(|r| {
                r.resources.as_ref().is_some_and(|rs| rs.contains(plural))
                    && r.operations.as_ref().is_some_and(|o| {
                        o.contains(&"CREATE".to_string()) && o.contains(&"UPDATE".to_string())
                    })
                    && r.scope.as_deref() == Some("*")
            }),
            "webhook.yaml: {plural} is not checked for unknown fields on create and update"
        );
    }
}
