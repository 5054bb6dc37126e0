//! HTTP contract of what the controller never deletes unless asked: a
//! deleted rule's objects (`deletionPolicy: Orphan`, the default), objects
//! carrying `helm.sh/resource-policy: keep`, objects that existed before
//! they were adopted, and a mass of prunes of one rule until it is
//! confirmed. A policy refusal still revokes, however many.
//!
//! Each test drives `Syncer::sync` against a scripted API server and
//! asserts exactly which requests were sent.

mod support;

use std::collections::BTreeMap;

use http::Method;
use rbac_rules::controller::apply::Outcome;
use rbac_rules::controller::plan::{CONFIRM_PRUNE_ANNOTATION, KeepReason};
use serde_json::{Value, json};
use support::api::{ApiServer, namespace, owned, pair, rule, rules, snapshot, store, syncer};

const ROLES: &str = "/apis/rbac.authorization.k8s.io/v1/namespaces/team-a/roles";
const EVENTS: &str = "/apis/events.k8s.io/v1/namespaces/default/events";
const STATUS: &str = "/apis/rbacrules.io/v1alpha1/rbacrules/ns-viewer/status";

/// A Namespace-triggered rule: one Role `viewer` per namespace.
fn viewer_spec(policy: Option<&str>) -> Value {
    let mut spec = json!({
        "trigger": {"kind": "Namespace", "pause": {"annotation": "rbacrules.io/paused"}},
        "outputs": [
            {"kind": "Role", "name": "viewer",
             "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}]}
        ]
    });
    if let Some(p) = policy {
        spec["deletionPolicy"] = json!(p);
    }
    spec
}

/// A Role of `rule` in `ns`, as our writes leave it.
fn role(ns: &str, name: &str, rule: &str, extra_annotations: Value) -> Value {
    let mut annotations = json!({"rbacrules.io/rule": rule,
        "rbacrules.io/trigger": format!("Namespace/{ns}")});
    for (k, v) in extra_annotations.as_object().into_iter().flatten() {
        annotations[k] = v.clone();
    }
    json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": name, "namespace": ns,
            "labels": {"app.kubernetes.io/managed-by": "rbac-rules", "rbacrules.io/rule": rule},
            "annotations": annotations,
            "ownerReferences": [{"apiVersion": "v1", "kind": "Namespace", "name": ns,
                "uid": format!("{ns}-uid"), "controller": true, "blockOwnerDeletion": true}]},
        "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}],
    })
}

/// One request as seen: method, path, body.
type Seen = (Method, String, Value);

/// Answers every request as a real server would (applies echoed, deletes
/// done, status patches and Events accepted) and returns them in order.
async fn serve(mut server: ApiServer) -> Vec<Seen> {
    let mut seen = Vec::new();
    while let Some(r) = server.next_opt().await {
        seen.push((r.method.clone(), r.path.clone(), r.body.clone()));
        if r.method == Method::DELETE {
            r.deleted();
        } else if r.path == EVENTS {
            let body = r.body.clone();
            r.respond(201, body);
        } else if r.path.ends_with("/status") {
            let name = r
                .path
                .split('/')
                .nth_back(1)
                .unwrap_or_default()
                .to_string();
            let body = json!({"apiVersion": "rbacrules.io/v1alpha1", "kind": "RbacRule",
                "metadata": {"name": name}, "spec": viewer_spec(None),
                "status": r.body["status"]});
            r.respond(200, body);
        } else if r.method == Method::PATCH {
            r.echo();
        } else {
            panic!("unexpected {} {}", r.method, r.path);
        }
    }
    seen
}

fn deletes(seen: &[Seen]) -> Vec<String> {
    seen.iter()
        .filter(|(m, _, _)| *m == Method::DELETE)
        .map(|(_, p, _)| p.clone())
        .collect()
}

fn events(seen: &[Seen]) -> Vec<(String, String)> {
    seen.iter()
        .filter(|(_, p, _)| p == EVENTS)
        .map(|(_, _, b)| {
            (
                b["reason"].as_str().unwrap_or_default().to_string(),
                b["note"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

/// The Degraded condition of the last status patch: (status, reason, message).
fn degraded(seen: &[Seen]) -> (String, String, String) {
    let (_, _, body) = seen
        .iter()
        .rev()
        .find(|(_, p, _)| p.ends_with("/status"))
        .expect("a status patch");
    let c = body["status"]["conditions"]
        .as_array()
        .expect("conditions")
        .iter()
        .find(|c| c["type"] == "Degraded")
        .expect("Degraded");
    let s = |k: &str| c[k].as_str().unwrap_or_default().to_string();
    (s("status"), s("reason"), s("message"))
}

#[tokio::test]
async fn a_deleted_rule_with_the_default_policy_sends_no_delete() {
    let (client, server) = pair();
    // The rule is gone: its objects are all that is left of it.
    let rules = rules(vec![]);
    let observed = store(vec![namespace("team-a", json!({}))]);
    let live = owned(vec![
        role("team-a", "viewer", "gone", json!({})),
        role("team-a", "editor", "gone", json!({})),
    ]);
    let holds = BTreeMap::new();
    let scenario = tokio::spawn(serve(server));
    let mut s = syncer(client);
    let report = s.sync(&snapshot(&rules, &observed, &live, &holds)).await;
    drop(s);
    let seen = scenario.await.expect("scenario");
    assert!(seen.is_empty(), "nothing sent: {seen:?}");
    let kept: Vec<_> = report.plan.kept.iter().map(|k| k.2).collect();
    assert_eq!(kept, vec![KeepReason::Orphaned, KeepReason::Orphaned]);
}

#[tokio::test]
async fn a_deleted_rule_with_delete_policy_is_pruned() {
    let (client, server) = pair();
    let rules = rules(vec![]);
    let observed = store(vec![namespace("team-a", json!({}))]);
    let live = owned(vec![role(
        "team-a",
        "viewer",
        "gone",
        json!({"rbacrules.io/deletion-policy": "Delete"}),
    )]);
    let holds = BTreeMap::new();
    let scenario = tokio::spawn(serve(server));
    let mut s = syncer(client);
    s.sync(&snapshot(&rules, &observed, &live, &holds)).await;
    drop(s);
    let seen = scenario.await.expect("scenario");
    assert_eq!(deletes(&seen), vec![format!("{ROLES}/viewer")]);
    let (_, _, body) = &seen[0];
    assert_eq!(
        body["preconditions"],
        json!({"uid": "viewer-live-uid", "resourceVersion": "5"})
    );
    assert_eq!(seen.len(), 1, "{seen:?}");
}

#[tokio::test]
async fn a_delete_rule_writes_its_policy_on_its_outputs_and_an_orphan_rule_does_not() {
    for (policy, annotation) in [(Some("Delete"), Some("Delete")), (None, None)] {
        let (client, server) = pair();
        let rules = rules(vec![rule("ns-viewer", viewer_spec(policy), None)]);
        let observed = store(vec![namespace("team-a", json!({}))]);
        let live = BTreeMap::new();
        let holds = BTreeMap::new();
        let scenario = tokio::spawn(serve(server));
        let mut s = syncer(client);
        s.sync(&snapshot(&rules, &observed, &live, &holds)).await;
        drop(s);
        let seen = scenario.await.expect("scenario");
        let (m, p, body) = &seen[0];
        assert_eq!(
            (m, p.as_str()),
            (&Method::PATCH, &*format!("{ROLES}/viewer"))
        );
        let mut want = role("team-a", "viewer", "ns-viewer", json!({}));
        if let Some(a) = annotation {
            want["metadata"]["annotations"]["rbacrules.io/deletion-policy"] = json!(a);
        }
        assert_eq!(body, &want, "{policy:?}");
    }
}

#[tokio::test]
async fn an_object_with_helm_keep_is_never_pruned() {
    let (client, server) = pair();
    // The rule lives and no longer wants `old`; the other rule is gone and
    // asked for deletion. Both carry Helm's keep.
    let rules = rules(vec![rule("ns-viewer", viewer_spec(None), None)]);
    let observed = store(vec![namespace("team-a", json!({}))]);
    let keep = json!({"helm.sh/resource-policy": "keep", "meta.helm.sh/release-name": "x"});
    let mut gone_keep = keep.clone();
    gone_keep["rbacrules.io/deletion-policy"] = json!("Delete");
    let viewer = role("team-a", "viewer", "ns-viewer", json!({}));
    let live = owned(vec![
        viewer,
        role("team-a", "old", "ns-viewer", keep),
        role("team-a", "other", "gone", gone_keep),
    ]);
    let holds = BTreeMap::new();
    let scenario = tokio::spawn(serve(server));
    let mut s = syncer(client);
    let report = s.sync(&snapshot(&rules, &observed, &live, &holds)).await;
    drop(s);
    let seen = scenario.await.expect("scenario");
    assert!(deletes(&seen).is_empty(), "{seen:?}");
    let kept: Vec<_> = report
        .plan
        .kept
        .iter()
        .map(|k| (k.0.name.to_string(), k.2))
        .collect();
    assert_eq!(
        kept,
        vec![
            ("old".to_string(), KeepReason::ResourcePolicyKeep),
            ("other".to_string(), KeepReason::ResourcePolicyKeep),
        ]
    );
}

#[tokio::test]
async fn an_adopted_object_is_marked_kept_marked_and_released_not_deleted() {
    // Adoption marks the object: it existed before.
    let (client, mut server) = pair();
    let rules_ = rules(vec![rule("ns-viewer", viewer_spec(Some("Delete")), None)]);
    let observed = store(vec![namespace("team-a", json!({}))]);
    let none = BTreeMap::new();
    let holds = BTreeMap::new();
    let taken = std::collections::BTreeSet::from([rbac_rules::controller::live::ObjectId::new(
        rbac_rules::api::OutputKind::Role,
        "team-a",
        "viewer",
    )]);
    let scenario = tokio::spawn(async move {
        server
            .next()
            .await
            .expect(Method::GET, &format!("{ROLES}/viewer"))
            .respond(
                200,
                json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                "metadata": {"name": "viewer", "namespace": "team-a", "uid": "u1",
                    "resourceVersion": "3", "labels": {"app.kubernetes.io/managed-by": "Helm"}},
                "rules": []}),
            );
        let apply = server.next().await.expect_apply(&format!("{ROLES}/viewer"));
        let body = apply.body.clone();
        apply.echo();
        let rest = serve(server).await;
        (body, rest)
    });
    let mut s = syncer(client).adopt_existing(true);
    let report = s
        .sync(&rbac_rules::controller::sync::Snapshot {
            foreign: &taken,
            ..snapshot(&rules_, &observed, &none, &holds)
        })
        .await;
    drop(s);
    let (body, rest) = scenario.await.expect("scenario");
    assert!(matches!(report.written()[0].outcome, Outcome::Adopted(_)));
    let mut want = role("team-a", "viewer", "ns-viewer", json!({}));
    want["metadata"]["annotations"]["rbacrules.io/deletion-policy"] = json!("Delete");
    want["metadata"]["annotations"]["rbacrules.io/adopted"] = json!("true");
    assert_eq!(body, want);
    assert!(deletes(&rest).is_empty());

    // Later applies keep the mark (no update just to drop it) ...
    let (client, server) = pair();
    let adopted = want.clone();
    let live = owned(vec![adopted.clone()]);
    let scenario = tokio::spawn(serve(server));
    let mut s = syncer(client);
    let report = s.sync(&snapshot(&rules_, &observed, &live, &holds)).await;
    drop(s);
    let seen = scenario.await.expect("scenario");
    assert!(report.plan.applies.is_empty(), "{:?}", report.plan.applies);
    assert!(
        seen.iter()
            .all(|(m, p, _)| *m != Method::PATCH || p.ends_with("/status")),
        "{seen:?}"
    );

    // ... and once its rule is gone, even with deletionPolicy Delete, it is
    // released, not deleted.
    let (client, server) = pair();
    let no_rules = rules(vec![]);
    let scenario = tokio::spawn(serve(server));
    let mut s = syncer(client);
    let report = s.sync(&snapshot(&no_rules, &observed, &live, &holds)).await;
    drop(s);
    let seen = scenario.await.expect("scenario");
    assert!(seen.is_empty(), "{seen:?}");
    assert_eq!(report.plan.kept[0].2, KeepReason::Adopted);
}

/// Three Roles of ns-viewer in team-a it no longer emits.
fn three_stale() -> Vec<Value> {
    ["a", "b", "c"]
        .iter()
        .map(|n| role("team-a", &format!("old-{n}"), "ns-viewer", json!({})))
        .collect()
}

#[tokio::test]
async fn a_mass_prune_is_held_and_reported_then_proceeds_once_confirmed() {
    let (client, server) = pair();
    let mut objects = three_stale();
    let viewer = role("team-a", "viewer", "ns-viewer", json!({}));
    objects.push(viewer);
    let live = owned(objects);
    let observed = store(vec![namespace("team-a", json!({}))]);
    let holds = BTreeMap::new();
    let rules_ = rules(vec![rule("ns-viewer", viewer_spec(Some("Delete")), None)]);
    let scenario = tokio::spawn(serve(server));
    let mut s = syncer(client).max_unconfirmed_prunes(2);
    let report = s.sync(&snapshot(&rules_, &observed, &live, &holds)).await;
    drop(s);
    let seen = scenario.await.expect("scenario");
    assert!(deletes(&seen).is_empty(), "held: {seen:?}");
    let held = &report.plan.held_prunes["ns-viewer"];
    assert_eq!(held.objects.len(), 3);
    let token = held.token.clone();
    let (status, reason, message) = degraded(&seen);
    assert_eq!((status.as_str(), reason.as_str()), ("True", "PruneHeld"));
    let expected = format!(
        "3 deletions held: more than --max-unconfirmed-prunes (2) in one pass \
         (Role team-a/old-a, Role team-a/old-b, Role team-a/old-c); nothing is deleted until \
         confirmed: kubectl annotate rbacrule ns-viewer --overwrite {CONFIRM_PRUNE_ANNOTATION}={token}"
    );
    assert_eq!(message, expected);
    let ev = events(&seen);
    assert!(
        ev.iter().any(|(r, n)| r == "PruneHeld" && n == &expected),
        "{ev:?}"
    );

    // A wrong token confirms nothing.
    for (confirm, want) in [("0000", 0), (token.as_str(), 3)] {
        let (client, server) = pair();
        let mut r = rule("ns-viewer", viewer_spec(Some("Delete")), None);
        r.metadata.annotations = Some(BTreeMap::from([(
            CONFIRM_PRUNE_ANNOTATION.to_string(),
            confirm.to_string(),
        )]));
        let rules_ = rules(vec![r]);
        let scenario = tokio::spawn(serve(server));
        let mut s = syncer(client).max_unconfirmed_prunes(2);
        s.sync(&snapshot(&rules_, &observed, &live, &holds)).await;
        drop(s);
        let seen = scenario.await.expect("scenario");
        let d = deletes(&seen);
        assert_eq!(d.len(), want, "{confirm}: {seen:?}");
        if want == 3 {
            assert_eq!(
                d,
                vec![
                    format!("{ROLES}/old-a"),
                    format!("{ROLES}/old-b"),
                    format!("{ROLES}/old-c")
                ]
            );
        }
    }
}

#[tokio::test]
async fn prunes_up_to_the_limit_need_no_confirmation() {
    let (client, server) = pair();
    let live = owned(three_stale());
    let observed = store(vec![namespace("team-a", json!({}))]);
    let holds = BTreeMap::new();
    let rules_ = rules(vec![rule("ns-viewer", viewer_spec(None), None)]);
    let scenario = tokio::spawn(serve(server));
    let mut s = syncer(client).max_unconfirmed_prunes(3);
    let report = s.sync(&snapshot(&rules_, &observed, &live, &holds)).await;
    drop(s);
    let seen = scenario.await.expect("scenario");
    assert_eq!(deletes(&seen).len(), 3, "{seen:?}");
    assert!(report.plan.held_prunes.is_empty());
}

#[tokio::test]
async fn a_policy_refusal_revokes_even_in_a_mass_and_nothing_holds_it() {
    let (client, server) = pair();
    let rules_ = rules(vec![rule("ns-viewer", viewer_spec(None), None)]);
    // Paused triggers keep their outputs, but a refused live object is
    // revoked whatever keeps it, and the hold (every prune held: 0) never
    // applies to a revocation.
    let namespaces = ["team-a", "team-b", "team-c"];
    let mut observed = store(
        namespaces
            .iter()
            .map(|n| namespace(n, json!({"rbacrules.io/paused": "true"})))
            .collect(),
    );
    let hostile: Vec<Value> = namespaces
        .iter()
        .map(|n| {
            let mut r = role(
                n,
                "viewer",
                "ns-viewer",
                json!({"helm.sh/resource-policy": "keep", "rbacrules.io/adopted": "true"}),
            );
            r["rules"] = json!([{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]);
            r
        })
        .collect();
    for h in &hostile {
        observed.insert(h.clone()).expect("role");
    }
    let live = owned(hostile);
    let holds = BTreeMap::new();
    let scenario = tokio::spawn(serve(server));
    let mut s = syncer(client).max_unconfirmed_prunes(0);
    let report = s.sync(&snapshot(&rules_, &observed, &live, &holds)).await;
    drop(s);
    let seen = scenario.await.expect("scenario");
    let mut d = deletes(&seen);
    d.sort();
    assert_eq!(
        d,
        namespaces
            .iter()
            .map(|n| format!("/apis/rbac.authorization.k8s.io/v1/namespaces/{n}/roles/viewer"))
            .collect::<Vec<_>>()
    );
    assert!(report.plan.held_prunes.is_empty());
    assert_eq!(
        report
            .written()
            .iter()
            .filter(|w| matches!(w.outcome, Outcome::Revoked(_)))
            .count(),
        3
    );
    let _ = STATUS;
}

#[tokio::test]
async fn an_orphaned_object_policy_refuses_is_still_revoked() {
    let (client, server) = pair();
    // Its rule is gone (Orphan): the object stays only while policy allows
    // what it grants; one granting everything is revoked.
    let rules_ = rules(vec![]);
    let mut observed = store(vec![namespace("team-a", json!({}))]);
    let mut hostile = role("team-a", "viewer", "gone", json!({}));
    hostile["rules"] = json!([{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]);
    observed.insert(hostile.clone()).expect("role");
    let live = owned(vec![hostile, role("team-a", "fine", "gone", json!({}))]);
    let holds = BTreeMap::new();
    let scenario = tokio::spawn(serve(server));
    let mut s = syncer(client);
    let report = s.sync(&snapshot(&rules_, &observed, &live, &holds)).await;
    drop(s);
    let seen = scenario.await.expect("scenario");
    assert_eq!(deletes(&seen), vec![format!("{ROLES}/viewer")], "{seen:?}");
    assert!(matches!(report.written()[0].outcome, Outcome::Revoked(_)));
    assert_eq!(report.plan.kept.len(), 1, "the allowed one stays");
}

#[tokio::test]
async fn outputs_of_triggers_the_rule_does_not_believe_are_pruned_even_in_a_mass() {
    let (client, server) = pair();
    // Three namespaces now fail the trigger's require (their data is not
    // believed): their Roles go at once, like a refusal, whatever the
    // limit; the mass from team-z's rename is held.
    let mut spec = viewer_spec(None);
    spec["trigger"]["require"] = json!([{"path": "metadata.labels.trusted", "equals": "yes"}]);
    let rules_ = rules(vec![rule("ns-viewer", spec, None)]);
    let teams = ["team-a", "team-b", "team-c"];
    let mut namespaces: Vec<Value> = teams.iter().map(|n| namespace(n, json!({}))).collect();
    let mut trusted = namespace("team-z", json!({}));
    trusted["metadata"]["labels"] = json!({"trusted": "yes"});
    namespaces.push(trusted);
    let observed = store(namespaces);
    let mut objects: Vec<Value> = teams
        .iter()
        .map(|n| role(n, "viewer", "ns-viewer", json!({})))
        .collect();
    objects.push(role("team-z", "viewer", "ns-viewer", json!({})));
    for n in ["x", "y"] {
        objects.push(role("team-z", &format!("old-{n}"), "ns-viewer", json!({})));
    }
    let live = owned(objects);
    let holds = BTreeMap::new();
    let scenario = tokio::spawn(serve(server));
    let mut s = syncer(client).max_unconfirmed_prunes(1);
    let report = s.sync(&snapshot(&rules_, &observed, &live, &holds)).await;
    drop(s);
    let seen = scenario.await.expect("scenario");
    let mut d = deletes(&seen);
    d.sort();
    assert_eq!(
        d,
        teams
            .iter()
            .map(|n| format!("/apis/rbac.authorization.k8s.io/v1/namespaces/{n}/roles/viewer"))
            .collect::<Vec<_>>()
    );
    let held = &report.plan.held_prunes["ns-viewer"];
    assert_eq!(
        held.objects
            .iter()
            .map(|o| o.to_string())
            .collect::<Vec<_>>(),
        vec!["Role team-z/old-x", "Role team-z/old-y"]
    );
}
