//! Server-side apply field ownership, as leader election relies on it.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use kube_lease_manager::LeaseManagerBuilder;
use kubesim::apiserver::ApiServer;
use serde_json::json;

fn client(server: &ApiServer) -> Client {
    Client::new(server.router(), "default")
}

#[tokio::test]
async fn apply_conflicts_with_another_managers_field_unless_forced() {
    let server = ApiServer::new();
    let leases: Api<Lease> = Api::namespaced(client(&server), "default");
    let holder = |who: &str| json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": "l"}, "spec": {"holderIdentity": who}});
    leases
        .patch("l", &PatchParams::apply("a"), &Patch::Apply(holder("a")))
        .await
        .unwrap();
    leases
        .patch("l", &PatchParams::apply("a"), &Patch::Apply(holder("a")))
        .await
        .unwrap();
    let err = leases
        .patch("l", &PatchParams::apply("b"), &Patch::Apply(holder("b")))
        .await
        .unwrap_err();
    match err {
        kube::Error::Api(s) => {
            assert_eq!(s.code, 409);
            assert!(
                s.message
                    .contains("conflict with \"a\": .spec.holderIdentity"),
                "{}",
                s.message
            );
        }
        other => panic!("{other}"),
    }
    // The same value is no conflict; force takes the field over.
    leases
        .patch("l", &PatchParams::apply("b"), &Patch::Apply(holder("a")))
        .await
        .unwrap();
    let l = leases
        .patch(
            "l",
            &PatchParams::apply("b").force(),
            &Patch::Apply(holder("b")),
        )
        .await
        .unwrap();
    assert_eq!(l.spec.unwrap().holder_identity.as_deref(), Some("b"));
}

#[tokio::test]
async fn one_leader_at_a_time_with_kube_lease_manager() {
    let server = ApiServer::new();
    let manager = |id: &'static str| {
        let client = client(&server);
        async move {
            LeaseManagerBuilder::new(client, "cdi-controller-leader-election-helper")
                .with_namespace("default")
                .with_identity(id)
                .with_duration(3)
                .with_grace(1)
                .build()
                .await
                .unwrap()
                .watch()
                .await
        }
    };
    let (mut a, a_task) = manager("a").await;
    tokio::time::timeout(Duration::from_secs(10), a.changed())
        .await
        .unwrap()
        .unwrap();
    assert!(*a.borrow(), "the first manager leads");
    let (mut b, _b_task) = manager("b").await;
    // Two renewals by the first while the second runs: each time the second found the lease
    // held (had it lapsed, the second would have taken it).
    let leases: Api<Lease> = Api::namespaced(client(&server), "default");
    let renewed = || async {
        leases
            .get("cdi-controller-leader-election-helper")
            .await
            .unwrap()
            .spec
            .and_then(|s| s.renew_time)
            .map(|t| t.0)
    };
    let mut seen = vec![renewed().await];
    tokio::time::timeout(Duration::from_secs(20), async {
        while seen.len() < 3 {
            let now = renewed().await;
            if seen.last() != Some(&now) {
                seen.push(now);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("the first manager renews its lease");
    assert!(!*b.borrow(), "the second waits while the first renews");

    // The leader steps down: the other takes over.
    drop(a);
    a_task.await.unwrap().unwrap();
    tokio::time::timeout(Duration::from_secs(15), async {
        while !*b.borrow() {
            b.changed().await.unwrap();
        }
    })
    .await
    .expect("the second manager leads after the first released");
}
