//! Objects others forge are never ours. Whoever may write a Role or a
//! RoleBinding in a namespace (its admin), or a ClusterRole, may give it
//! any labels and annotations, our `app.kubernetes.io/managed-by:
//! rbac-rules` and `rbacrules.io/rule` among them. What our inventory made
//! is told by the `Apply` entry of our field manager in `managedFields`
//! (every write of ours is a server-side apply); a labelled object without
//! one is someone else's: the controller neither deletes, overwrites nor
//! judges it as ours, and reports it; `render` never fails on it.
//!
//! The one write the label and the entry do not fence in the controller —
//! a server-side apply with our label *under our field manager's name* —
//! is the admission fence's (`rbac-rules-inventory` in
//! deploy/admission.yaml, tested in tests/admission.rs): no identity but
//! the controller's may put our label on an object.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use proptest::prelude::*;
use rbac_rules::api::OutputKind;
use rbac_rules::controller::apply::adoption;
use rbac_rules::controller::live::{Live, ObjectId};
use rbac_rules::controller::plan::ApplyAction;
use rbac_rules::controller::sync::Snapshot;
use rbac_rules::controller::world::{Feed, World};
use rbac_rules::render::{RenderArgs, render_with_warnings};
use serde_json::{Value, json};
use support::cluster::{Behaviour, Controller, FakeCluster, RBAC};

/// One rule: a Role and a RoleBinding `viewer` in every Namespace.
fn viewer_rule() -> Value {
    json!({"apiVersion": "rbacrules.io/v1alpha1", "kind": "RbacRule",
    "metadata": {"name": "ns-viewer", "uid": "ns-viewer-uid", "generation": 1, "resourceVersion": "1"},
    "spec": {
        "trigger": {"kind": "Namespace", "metadataOnly": true},
        "outputs": [
            {"kind": "Role", "name": "viewer",
             "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]},
            {"kind": "RoleBinding", "name": "viewer",
             "roleRef": {"kind": "Role", "name": "viewer"},
             "subjects": [{"kind": "Group", "name": "{{trigger.metadata.name}}-devs"}]}
        ]
    }})
}

/// Everything, in every group: what policy refuses and revokes.
fn everything() -> Value {
    json!([{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}])
}

/// A Role a namespace admin made with kubectl, labelled as ours and naming
/// our rule and one of its triggers.
fn forged_role(ns: &str, name: &str, rules: Value, managed_fields: Value) -> Value {
    json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": name, "namespace": ns,
            "labels": {"app.kubernetes.io/managed-by": "rbac-rules", "rbacrules.io/rule": "ns-viewer"},
            "annotations": {"rbacrules.io/rule": "ns-viewer", "rbacrules.io/trigger": format!("Namespace/{ns}")},
            "managedFields": managed_fields},
        "rules": rules})
}

fn kubectl() -> Value {
    json!([{"manager": "kubectl-client-side-apply", "operation": "Update", "fieldsV1": {}}])
}

/// The running controller, against a stand-in API server: a namespace
/// admin's Roles and RoleBinding labelled ours — one where no output is,
/// granting everything (policy would revoke it were it ours), one a
/// binding the rule does not make (it would be pruned), one at the very
/// name the rule writes — are never deleted nor written; the rule's status
/// names them; the rule's own objects are made.
#[tokio::test]
async fn the_controller_never_deletes_nor_writes_what_others_label_ours() {
    let (client, fake) = FakeCluster::start(
        vec![viewer_rule()],
        &["team-a".to_string(), "team-b".to_string()],
        Behaviour::default(),
    );
    let path =
        |ns: &str, plural: &str, name: &str| format!("{RBAC}/namespaces/{ns}/{plural}/{name}");
    let revocable = path("team-a", "roles", "mine");
    fake.put_rbac(
        &revocable,
        forged_role("team-a", "mine", everything(), kubectl()),
    );
    let prunable = path("team-a", "rolebindings", "mine");
    fake.put_rbac(
        &prunable,
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": "mine", "namespace": "team-a",
                "labels": {"app.kubernetes.io/managed-by": "rbac-rules"},
                "annotations": {"rbacrules.io/rule": "ns-viewer", "rbacrules.io/trigger": "Namespace/team-a"},
                // A server-side apply, under another manager's name.
                "managedFields": [{"manager": "argocd-controller", "operation": "Apply", "fieldsV1": {}}]},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "mine"},
            "subjects": [{"kind": "User", "name": "alice"}]}),
    );
    let squatted = path("team-b", "roles", "viewer");
    fake.put_rbac(
        &squatted,
        forged_role("team-b", "viewer", everything(), kubectl()),
    );
    let controller = Controller::start(client, &[]);
    let made = [
        path("team-a", "roles", "viewer"),
        path("team-a", "rolebindings", "viewer"),
    ];
    fake.until(Duration::from_secs(20), "the rule's objects made", |f| {
        let rbac = f.rbac();
        made.iter().all(|p| rbac.contains_key(p))
    })
    .await;
    let status_says = |f: &FakeCluster| {
        let rules = f.rules();
        let degraded = rules[0]["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["type"] == "Degraded")
            .cloned()
            .unwrap_or(Value::Null);
        degraded["message"].as_str().unwrap_or_default().to_string()
    };
    fake.until(
        Duration::from_secs(20),
        "the rule's status names them",
        |f| {
            let m = status_says(f);
            m.contains("Role team-a/mine") && m.contains("RoleBinding team-a/mine")
        },
    )
    .await;
    // Let any further pass run.
    tokio::time::sleep(Duration::from_millis(300)).await;
    controller.stop().await;
    let log = fake.log();
    for p in [&revocable, &prunable, &squatted] {
        assert!(!log.contains(&format!("DELETE {p}")), "{p}: {log:#?}");
        assert!(!log.contains(&format!("PATCH {p}")), "{p}: {log:#?}");
        assert!(fake.rbac().contains_key(p.as_str()), "{p}");
    }
    // The squatter keeps its content, and is judged as what it is: the
    // binding of it is refused, not made.
    assert_eq!(fake.rbac()[&squatted]["rules"], everything());
    assert!(
        !fake
            .rbac()
            .contains_key(&path("team-b", "rolebindings", "viewer"))
    );
    let message = status_says(&fake);
    assert!(message.contains("rbac-rules did not make it"), "{message}");
    assert!(message.contains("Role team-b/viewer"), "{message}");
}

/// `render` of a dump holding a namespace admin's Role labelled ours that
/// policy refuses: exit 0, the output printed, a warning on stderr — as
/// `kubectl get -o yaml` dumps it (no managedFields: nothing tells) and with
/// managedFields showing someone else made it.
#[test]
fn render_of_a_dump_with_a_forged_role_prints_and_warns() {
    let rules = serde_yaml_rule();
    for (case, managed_fields) in [("dump", Value::Null), ("managedFields", kubectl())] {
        let mut role = forged_role("team-a", "mine", everything(), managed_fields);
        if role["metadata"]["managedFields"].is_null() {
            role["metadata"]
                .as_object_mut()
                .expect("metadata")
                .remove("managedFields");
        }
        let objects = format!(
            "apiVersion: v1\nkind: Namespace\nmetadata: {{name: team-a}}\n---\n{}",
            serde_json::to_string(&role).expect("json")
        );
        let out = support::cli::render(&rules, &objects, &[]);
        let err = out.stderr.as_str();
        assert_eq!(out.code, Some(0), "{case}: {err}");
        assert!(
            out.stdout.contains("kind: Role\n") && out.stdout.contains("name: viewer"),
            "{case}: {}",
            out.stdout
        );
        assert!(!err.contains("error"), "{case}: {err}");
        assert!(
            err.contains("warning:") && err.contains("Role team-a/mine is labelled"),
            "{case}: {err}"
        );
    }
}

/// The rule as YAML text (`render` reads files).
fn serde_yaml_rule() -> String {
    let mut rule = viewer_rule();
    let meta = rule["metadata"].as_object_mut().expect("metadata");
    meta.retain(|k, _| k == "name");
    serde_json::to_string(&rule).expect("json")
}

// ---------------------------------------------------------------------
// Property: over a namespace admin's writes.
// ---------------------------------------------------------------------

/// One object a namespace admin writes in its namespace (or, `cluster`,
/// whoever may write ClusterRoles and ClusterRoleBindings): kind, name,
/// labels, annotations, who wrote it (managedFields) and what it grants.
#[derive(Clone, Debug)]
struct Write {
    cluster: bool,
    binding: bool,
    name: &'static str,
    labels: BTreeMap<&'static str, &'static str>,
    annotations: BTreeMap<&'static str, String>,
    managers: Vec<(&'static str, &'static str)>,
    grants_everything: bool,
}

/// A namespace admin's write: any of our keys, others', any managers.
fn write_strategy() -> impl Strategy<Value = Write> {
    let label = prop::sample::select(vec![
        ("app.kubernetes.io/managed-by", "rbac-rules"),
        ("app.kubernetes.io/managed-by", "Helm"),
        ("rbacrules.io/rule", "ns-viewer"),
        ("rbacrules.io/rule", "gone"),
        ("app", "mine"),
        ("rbac.authorization.k8s.io/aggregate-to-admin", "true"),
    ]);
    let annotation = prop::sample::select(vec![
        ("rbacrules.io/rule", "ns-viewer"),
        ("rbacrules.io/rule", "gone"),
        ("rbacrules.io/trigger", "Namespace/team-a"),
        ("rbacrules.io/trigger", "Namespace/team-b"),
        ("meta.helm.sh/release-name", "x"),
    ]);
    let manager = (
        prop::sample::select(vec![
            "kubectl",
            "kubectl-client-side-apply",
            "helm",
            "argocd-controller",
            "rbac-rules",
        ]),
        prop::sample::select(vec!["Update", "Apply"]),
    );
    (
        (any::<bool>(), any::<bool>()),
        prop::sample::select(vec!["viewer", "mine", "other"]),
        prop::collection::vec(label, 0..4),
        prop::collection::vec(annotation, 0..4),
        prop::collection::vec(manager, 1..3),
        any::<bool>(),
    )
        .prop_map(
            |((cluster, binding), name, labels, annotations, managers, grants_everything)| Write {
                cluster,
                binding,
                name,
                labels: labels.into_iter().collect(),
                annotations: annotations
                    .into_iter()
                    .map(|(k, v)| (k, v.to_string()))
                    .collect(),
                managers,
                grants_everything,
            },
        )
}

impl Write {
    fn labelled_ours(&self) -> bool {
        self.labels.get("app.kubernetes.io/managed-by") == Some(&"rbac-rules")
    }

    /// Whether the API server would take it from a namespace admin with the
    /// fence installed, or is one the controller could tell from its own
    /// without it: only our label applied under our field manager's name is
    /// neither (the fence refuses our label to everyone but the
    /// controller: tests/admission.rs).
    fn possible(&self) -> bool {
        !(self.labelled_ours()
            && self
                .managers
                .iter()
                .any(|(m, op)| *m == "rbac-rules" && *op == "Apply"))
    }

    fn object(&self, ns: &str, with_managed_fields: bool) -> Value {
        let mut metadata = json!({"name": self.name,
            "uid": format!("{ns}-{}-{}-admin-uid", self.cluster, self.name), "resourceVersion": "7",
            "labels": self.labels, "annotations": self.annotations});
        if !self.cluster {
            metadata["namespace"] = json!(ns);
        }
        let (role, binding) = match self.cluster {
            true => ("ClusterRole", "ClusterRoleBinding"),
            false => ("Role", "RoleBinding"),
        };
        if with_managed_fields {
            metadata["managedFields"] = self
                .managers
                .iter()
                .map(|(m, op)| json!({"manager": m, "operation": op, "fieldsV1": {}}))
                .collect();
        }
        if self.binding {
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": binding,
                "metadata": metadata,
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role, "name": "viewer"},
                "subjects": [{"kind": "User", "name": "mallory"}]})
        } else {
            let rules = if self.grants_everything {
                everything()
            } else {
                json!([{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]}])
            };
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": role,
                "metadata": metadata, "rules": rules})
        }
    }
}

fn namespace(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": name, "uid": format!("{name}-uid"), "resourceVersion": "1"}})
}

/// The objects the admin's writes leave (the last write of a name wins).
fn admin_objects(writes: &[Write], with_managed_fields: bool) -> Vec<Value> {
    let mut by_id: BTreeMap<(bool, bool, &str), Value> = BTreeMap::new();
    for w in writes.iter().filter(|w| w.possible()) {
        by_id.insert(
            (w.cluster, w.binding, w.name),
            w.object("team-a", with_managed_fields),
        );
    }
    by_id.into_values().collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Whatever a namespace admin writes in its namespace (or a writer of
    /// ClusterRoles at cluster scope) — labels,
    /// annotations, field managers, grants — the controller plans no delete
    /// and no update of it, and a create at its name goes through a look at
    /// the holder that refuses to adopt it; `render` of the dump succeeds.
    #[test]
    fn a_namespace_admins_writes_are_never_the_controllers(
        writes in prop::collection::vec(write_strategy(), 1..6),
        dumped_with_managed_fields in any::<bool>(),
    ) {
        let objects = admin_objects(&writes, true);
        // The controller's view: the watches deliver them with managedFields.
        let mut world = World::new(None);
        let rule: rbac_rules::api::RbacRule =
            serde_json::from_value(viewer_rule()).expect("rule");
        world.apply(Feed::Rules(Box::new(kube::runtime::watcher::Event::Apply(rule))));
        let mut admin_ids = BTreeSet::new();
        for o in &objects {
            let live = Live::new(o.clone());
            let id = live.id().cloned().expect("id");
            admin_ids.insert(id.clone());
            let kind = id.kind;
            world.apply(Feed::Owned(kind, kube::runtime::watcher::Event::Apply(live)));
        }
        let observed = support::api::store(vec![namespace("team-a"), namespace("team-b")]);
        let holds = BTreeMap::new();
        let snap = Snapshot {
            rules: &world.rules,
            observed: &observed,
            owned: &world.owned,
            foreign: &world.foreign,
            forged: &world.forged,
            holds: &holds,
            allow: None,
            prune: true,
        };
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let _entered = runtime.enter();
        let (client, _server) = support::api::pair();
        let mut syncer = support::api::syncer(client);
        let (_evaluation, plan) = syncer.evaluate(&snap);
        for d in &plan.deletes {
            prop_assert!(!admin_ids.contains(&d.id), "deletes {}: {:?}", d.id, plan.deletes);
        }
        for a in &plan.applies {
            if !admin_ids.contains(&a.id) {
                continue;
            }
            // Only a create, which looks at the holder first...
            prop_assert_eq!(&a.action, &ApplyAction::Create, "{}", a.id);
            prop_assert!(snap.foreign.contains(&a.id), "{} not looked at", a.id);
            // ... and does not adopt it.
            let existing = objects
                .iter()
                .find(|o| ObjectId::of(o).as_ref() == Some(&a.id))
                .expect("admin object");
            prop_assert!(adoption(&a.id, &a.body(), existing, false).is_err(), "{} adopted", a.id);
        }
        // Each labelled one is reported, on the rule it names.
        for o in &objects {
            let id = ObjectId::of(o).expect("id");
            let labelled = o["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "rbac-rules";
            prop_assert_eq!(world.forged.contains_key(&id), labelled, "{}", id);
        }

        // `render` of the same objects dumped, with or without
        // managedFields: our keys never make it fail. What fails with them
        // fails without them (an admin's Role squatting the name of ours
        // that grants everything: the binding of it is refused).
        let dumped = admin_objects(&writes, dumped_with_managed_fields);
        let with_claims = render_objects(&dumped);
        let without = render_objects(&dumped.iter().map(without_our_keys).collect::<Vec<_>>());
        if let Err(e) = &with_claims {
            prop_assert!(without.is_err(), "our keys made render fail: {}", e);
        }
        // A Role of ours at a name no admin object holds renders always.
        let squatted = dumped
            .iter()
            .any(|o| o["metadata"]["name"] == "viewer" && o["metadata"]["namespace"] == "team-a");
        if !squatted {
            let out = with_claims.as_ref().map_err(|e| e.to_string());
            prop_assert!(out.is_ok_and(|o| o.contains("name: viewer")), "render failed");
        }
    }
}

/// `render` of the rule on the two Namespaces and `objects`.
fn render_objects(objects: &[Value]) -> Result<String, String> {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut docs = vec![namespace("team-a"), namespace("team-b")];
    docs.extend(objects.iter().cloned());
    let text: Vec<String> = docs
        .iter()
        .map(|d| serde_json::to_string(d).expect("json"))
        .collect();
    std::fs::write(dir.path().join("objects.yaml"), text.join("\n---\n")).expect("write");
    std::fs::write(dir.path().join("rules.yaml"), serde_yaml_rule()).expect("write");
    render_with_warnings(&RenderArgs {
        objects: vec![dir.path().join("objects.yaml")],
        rules: vec![dir.path().join("rules.yaml")],
        manage: rbac_rules::api::ManageLevel::All,
        ..Default::default()
    })
    .map(|(out, _)| out)
    .map_err(|e| e.to_string())
}

/// `o` without our managed-by label and rbacrules.io/ keys.
fn without_our_keys(o: &Value) -> Value {
    let mut o = o.clone();
    for field in ["labels", "annotations"] {
        if let Some(m) = o["metadata"][field].as_object_mut() {
            m.retain(|k, v| {
                let claim = k.starts_with("rbacrules.io/")
                    || (k == "app.kubernetes.io/managed-by" && v == "rbac-rules");
                !claim
            });
        }
    }
    o
}

/// The property's premise: an object labelled ours under our field
/// manager's name is one of ours to the controller — which is why the
/// fence refuses our label to every identity but the controller's.
#[test]
fn our_label_under_our_managers_apply_is_ours_to_the_controller() {
    let role = forged_role(
        "team-a",
        "mine",
        everything(),
        json!([{"manager": "rbac-rules", "operation": "Apply", "fieldsV1": {}}]),
    );
    assert!(Live::new(role).is_ours());
    let id = ObjectId::new(OutputKind::Role, "team-a", "mine");
    assert_eq!(id.to_string(), "Role team-a/mine");
}

/// `explain` and `test` read the same dump without failing on it: the
/// forged Role is data, the rule's outputs are what they are.
#[test]
fn explain_and_test_carry_on_with_a_forged_role() {
    let dir = tempfile::tempdir().expect("tempdir");
    let role = forged_role("team-a", "mine", everything(), kubectl());
    let objects = format!(
        "apiVersion: v1\nkind: Namespace\nmetadata: {{name: team-a}}\n---\n{}",
        serde_json::to_string(&role).expect("json")
    );
    std::fs::write(dir.path().join("objects.yaml"), &objects).expect("write");
    std::fs::write(dir.path().join("rules.yaml"), serde_yaml_rule()).expect("write");
    let mut explain = support::cli::command(["explain"]);
    explain
        .args(["--as", "group:team-a-devs", "--objects"])
        .arg(dir.path().join("objects.yaml"))
        .arg("--rules")
        .arg(dir.path().join("rules.yaml"));
    let out = support::cli::output(&mut explain);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert!(out.stdout.contains("viewer"), "{}", out.stdout);
    std::fs::write(
        dir.path().join("test.yaml"),
        "apiVersion: rbacrules.io/v1alpha1\nkind: RbacRuleTest\nmetadata: {name: forged}\nspec:\n  rules: [rules.yaml]\n  objects: [objects.yaml]\n  expect:\n    access:\n    - {group: team-a-devs, namespace: team-a, can: get, resource: pods}\n    - {group: team-a-devs, namespace: team-a, cannot: get, resource: secrets}\n",
    )
    .expect("write");
    let mut test = support::cli::command(["test"]);
    test.arg(dir.path().join("test.yaml"));
    let out = support::cli::output(&mut test);
    assert_eq!(out.code, Some(0), "{}\n{}", out.stdout, out.stderr);
}
