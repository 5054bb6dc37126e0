//! Proof of lineage (issue: "a name in data is believed without proof"): a
//! type that a trigger merely *names* is granted only when its CRD exists
//! and carries an ownerReference (by uid) to the trigger or to a family
//! member — an ownerReference on a CRD can be written only by whoever may
//! write CRDs, never by whoever writes the revision or the XRD. And the
//! controller's own API group is never granted from data.

use std::collections::BTreeSet;

use rbac_rules::api::OutputKind;
use rbac_rules::engine::{Engine, ErrorKind, Evaluation, Options};
use serde_json::{Value, json};

mod support;
use support::engine::{builtin, crd, granted, rules, rules_of, store};

/// Every (group, resource) the desired roles grant.
fn granted_all(eval: &Evaluation) -> BTreeSet<(String, String)> {
    eval.desired
        .iter()
        .filter(|d| d.kind.is_role())
        .flat_map(|d| granted(d.object.to_value()))
        .collect()
}

/// The API groups granted beyond what the built-in rules grant on an
/// empty cluster (Crossplane's own fixed roles).
fn groups(eval: &Evaluation) -> BTreeSet<String> {
    let fixed = granted_all(&evaluate(&[]));
    granted_all(eval)
        .into_iter()
        .filter(|x| !fixed.contains(x))
        .map(|(g, _)| g)
        .collect()
}

/// A ProviderRevision of family `provider-family-x` (image org `org`),
/// naming `refs` in its objectRefs.
fn revision(name: &str, org: &str, refs: &[String], paused: bool) -> Value {
    let refs: Vec<Value> = refs
        .iter()
        .map(|n| json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition", "name": n}))
        .collect();
    let mut v = json!({"apiVersion": "pkg.crossplane.io/v1", "kind": "ProviderRevision",
        "metadata": {"name": name, "uid": format!("uid-{name}"),
                     "labels": {"pkg.crossplane.io/provider-family": "provider-family-x"}},
        "spec": {"image": format!("xpkg.example.org/{org}/{name}:v1")},
        "status": {"objectRefs": refs}});
    if paused {
        v["metadata"]["annotations"] = json!({"crossplane.io/paused": "true"});
    }
    v
}

fn xrd(name: &str, uid: &str, group: &str, plural: &str) -> Value {
    json!({"apiVersion": "apiextensions.crossplane.io/v1", "kind": "CompositeResourceDefinition",
        "metadata": {"name": name, "uid": uid},
        "spec": {"group": group, "names": {"kind": "X", "plural": plural}}})
}

/// A CRD nobody owns (installed by an admin, as the controller's own is).
fn unowned_crd(name: &str) -> Value {
    let (plural, group) = name.split_once('.').unwrap_or((name, ""));
    json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": name, "uid": format!("crd-{name}")},
        "spec": {"group": group, "names": {"plural": plural}}})
}

fn evaluate(objects: &[Value]) -> Evaluation {
    Engine::new(&builtin(), Options::default()).evaluate(&store(objects))
}

#[test]
fn a_revision_gets_only_the_types_whose_crds_it_owns() {
    let named = [
        "widgets.good.example.org".to_string(),
        "rbacrules.rbacrules.io".to_string(),
        "policies.othertool.example.com".to_string(),
        "buckets.s3.example.org".to_string(),
    ];
    let objects = [
        revision("provider-good", "org", &named, false),
        crd(
            "widgets.good.example.org",
            "ProviderRevision",
            "uid-provider-good",
            true,
        ),
        // Exists, owned by nobody: the controller's own type.
        unowned_crd("rbacrules.rbacrules.io"),
        unowned_crd("policies.othertool.example.com"),
        // Owned by another provider's revision.
        crd(
            "buckets.s3.example.org",
            "ProviderRevision",
            "uid-someone-else",
            true,
        ),
    ];
    let eval = evaluate(&objects);
    assert_eq!(
        eval.errors().count(),
        0,
        "{:?}",
        eval.errors().collect::<Vec<_>>()
    );
    let g = groups(&eval);
    assert!(g.contains("good.example.org"), "{g:?}");
    for bad in ["rbacrules.io", "othertool.example.com", "s3.example.org"] {
        assert!(!g.contains(bad), "{bad} granted from a name alone: {g:?}");
    }
}

#[test]
fn a_non_controller_owner_reference_is_proof_too() {
    // Crossplane's package manager makes an inactive revision a
    // non-controller owner of the CRDs its active sibling controls.
    let objects = [
        revision("provider-old", "org", &[], false),
        crd(
            "widgets.good.example.org",
            "ProviderRevision",
            "uid-provider-old",
            false,
        ),
    ];
    let eval = evaluate(&objects);
    let edit = rules_of(
        &eval,
        OutputKind::ClusterRole,
        "crossplane:provider:provider-old:aggregate-to-edit",
    );
    assert_eq!(edit[0]["apiGroups"], json!(["good.example.org"]), "{edit}");
}

#[test]
fn an_owner_reference_without_the_owners_uid_proves_nothing() {
    // Same kind and name, another uid (a revision deleted and re-created
    // by someone else): not the trigger.
    let mut c = crd(
        "widgets.good.example.org",
        "ProviderRevision",
        "uid-other",
        true,
    );
    c["metadata"]["ownerReferences"][0]["name"] = json!("provider-good");
    let eval = evaluate(&[revision("provider-good", "org", &[], false), c]);
    assert!(groups(&eval).is_empty(), "{:?}", groups(&eval));
}

#[test]
fn a_forged_family_member_lends_nothing_and_costs_its_victim_nothing() {
    let legit = [
        revision(
            "provider-good",
            "org",
            &["widgets.good.example.org".to_string()],
            false,
        ),
        crd(
            "widgets.good.example.org",
            "ProviderRevision",
            "uid-provider-good",
            true,
        ),
    ];
    let before = evaluate(&legit);
    // Forged, paused members of the same family and org: each names 10,001
    // types (past --max-list-length), among them the controller's own and
    // another tool's, and owns no CRD.
    let mut refs: Vec<String> = (0..10_001)
        .map(|i| format!("t{i}s.forged.example.org"))
        .collect();
    refs.push("rbacrules.rbacrules.io".to_string());
    refs.push("policies.othertool.example.com".to_string());
    let mut objects = legit.to_vec();
    for m in 0..8 {
        objects.push(revision(
            &format!("provider-forged-{m}"),
            "org",
            &refs,
            true,
        ));
    }
    objects.push(unowned_crd("rbacrules.rbacrules.io"));
    objects.push(unowned_crd("policies.othertool.example.com"));
    let after = evaluate(&objects);
    assert_eq!(
        after.errors().count(),
        0,
        "{:?}",
        after.errors().collect::<Vec<_>>()
    );
    // The legitimate member's roles are exactly what they were.
    for d in before.desired.iter() {
        let key = (d.kind, d.namespace.clone(), d.name.clone());
        assert_eq!(
            after.desired.get(&key).map(|a| a.object.to_value()),
            Some(d.object.to_value()),
            "{key:?}"
        );
    }
    let g = groups(&after);
    assert!(
        !g.contains("forged.example.org") && !g.contains("rbacrules.io"),
        "{g:?}"
    );
}

#[test]
fn family_members_lend_only_types_they_own() {
    let objects = [
        revision("provider-ec2", "org", &[], false),
        revision("provider-family", "org", &[], false),
        crd(
            "providerconfigs.family.example.org",
            "ProviderRevision",
            "uid-provider-family",
            true,
        ),
        crd(
            "instances.ec2.example.org",
            "ProviderRevision",
            "uid-provider-ec2",
            true,
        ),
    ];
    let eval = evaluate(&objects);
    let system = rules_of(
        &eval,
        OutputKind::ClusterRole,
        "crossplane:provider:provider-ec2:system",
    );
    let text = system.to_string();
    assert!(
        text.contains("family.example.org") && text.contains("ec2.example.org"),
        "{text}"
    );
}

#[test]
fn an_xrd_gets_roles_only_for_crds_it_controls() {
    let xrd_uid = "uid-xrd";
    let cases: [(&str, Vec<Value>, bool); 4] = [
        // Its CRD, controlled by it: roles.
        (
            "controlled",
            vec![crd(
                "xbuckets.a.example.org",
                "CompositeResourceDefinition",
                xrd_uid,
                true,
            )],
            true,
        ),
        // No CRD yet: nothing (until Crossplane makes it).
        ("missing", vec![], false),
        // Owned but not as controller, or by another XRD: nothing.
        (
            "not controller",
            vec![crd(
                "xbuckets.a.example.org",
                "CompositeResourceDefinition",
                xrd_uid,
                false,
            )],
            false,
        ),
        (
            "other XRD",
            vec![crd(
                "xbuckets.a.example.org",
                "CompositeResourceDefinition",
                "uid-other",
                true,
            )],
            false,
        ),
    ];
    for (what, crds, granted_expected) in cases {
        let mut objects = vec![xrd(
            "xbuckets.a.example.org",
            xrd_uid,
            "a.example.org",
            "xbuckets",
        )];
        objects.extend(crds);
        let eval = evaluate(&objects);
        assert_eq!(
            groups(&eval).contains("a.example.org"),
            granted_expected,
            "{what}: {:?}",
            groups(&eval)
        );
    }
}

#[test]
fn an_xrd_naming_an_existing_crd_it_does_not_control_gets_nothing() {
    // The controller's own type and another tool's: installed by an admin.
    for (group, plural) in [
        ("rbacrules.io", "rbacrules"),
        ("othertool.example.com", "policies"),
    ] {
        let objects = [
            xrd(&format!("{plural}.{group}"), "uid-x", group, plural),
            unowned_crd(&format!("{plural}.{group}")),
        ];
        let eval = evaluate(&objects);
        assert!(groups(&eval).is_empty(), "{group}: {:?}", groups(&eval));
    }
}

const OWN_GROUP_RULE: &str = r#"
apiVersion: rbacrules.io/v1alpha1
kind: RbacRule
metadata: {name: from-data}
spec:
  trigger: {apiGroup: example.org, kind: Widget}
  outputs:
  - kind: ClusterRole
    name: "widget:{{trigger.metadata.name}}"
    rules:
    - apiGroups: ["{{trigger.spec.group}}"]
      resources: [things]
      verbs: [get]
---
apiVersion: rbacrules.io/v1alpha1
kind: RbacRule
metadata: {name: literal}
spec:
  outputs:
  - kind: ClusterRole
    name: rule-authors
    rules:
    - apiGroups: [rbacrules.io]
      resources: [rbacrules]
      verbs: [get]
"#;

#[test]
fn the_controllers_own_group_is_never_granted_from_data() {
    let widget = |name: &str, group: &str| {
        json!({"apiVersion": "example.org/v1", "kind": "Widget",
               "metadata": {"name": name, "uid": name}, "spec": {"group": group}})
    };
    let objects = [
        widget("own", "rbacrules.io"),
        widget("sub", "x.rbacrules.io"),
        widget("fine", "other.example.org"),
        widget("lookalike", "notrbacrules.io"),
    ];
    let eval = Engine::new(&rules(OWN_GROUP_RULE), Options::default()).evaluate(&store(&objects));
    let refused: BTreeSet<&str> = eval
        .errors()
        .filter(|e| e.kind == ErrorKind::EscalationDenied)
        .filter_map(|e| e.trigger.as_deref())
        .collect();
    assert_eq!(
        refused,
        BTreeSet::from(["Widget.example.org/own", "Widget.example.org/sub"]),
        "{:?}",
        eval.errors().collect::<Vec<_>>()
    );
    let names: BTreeSet<&str> = eval.desired.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(
        names,
        BTreeSet::from(["rule-authors", "widget:fine", "widget:lookalike"]),
        "a literal grant on the group is the author's own; from data it is refused"
    );
}

mod props {
    use super::*;
    use proptest::prelude::*;

    /// Who a generated CRD's ownerReference names: the trigger, a member
    /// of its family (same org), a member from another org, a stranger,
    /// nobody.
    const OWNERS: [&str; 5] = [
        "uid-provider-a",
        "uid-provider-b",
        "uid-provider-evil",
        "uid-stranger",
        "",
    ];

    fn crd_of(plural: usize, group: usize, owner: usize, controller: bool) -> Value {
        let name = format!("t{plural}s.g{group}.example.org");
        if OWNERS[owner].is_empty() {
            unowned_crd(&name)
        } else {
            crd(&name, "ProviderRevision", OWNERS[owner], controller)
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(32))]

        /// Whatever CRDs exist and whatever the revisions name, provider-a
        /// is granted exactly the types whose CRDs it or its same-org
        /// family member owns.
        #[test]
        fn granted_types_are_exactly_the_owned_ones(
            crds in proptest::collection::vec((0..4usize, 0..3usize, 0..5usize, any::<bool>()), 0..12),
            named in proptest::collection::vec((0..4usize, 0..3usize), 0..6),
        ) {
            let refs: Vec<String> = named.iter().map(|(p, g)| format!("t{p}s.g{g}.example.org")).collect();
            let mut objects = vec![
                revision("provider-a", "org", &refs, false),
                revision("provider-b", "org", &refs, false),
                revision("provider-evil", "mallory", &refs, false),
            ];
            let mut expected = BTreeSet::new();
            let mut seen = BTreeSet::new();
            for &(p, g, o, c) in &crds {
                // One CRD per name, as in a cluster: the first wins.
                if !seen.insert((p, g)) {
                    continue;
                }
                objects.push(crd_of(p, g, o, c));
                if o < 2 {
                    expected.insert((format!("g{g}.example.org"), format!("t{p}s")));
                }
            }
            let eval = evaluate(&objects);
            prop_assert_eq!(eval.errors().count(), 0);
            let edit = rules_of(&eval, OutputKind::ClusterRole, "crossplane:provider:provider-a:aggregate-to-edit");
            let got: BTreeSet<(String, String)> = granted(json!({"rules": edit}))
                .into_iter()
                .filter(|(_, r)| !r.ends_with("/status"))
                .collect();
            prop_assert_eq!(got, expected);
        }
    }
}
