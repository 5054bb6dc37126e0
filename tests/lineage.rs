//! Proof of lineage (issue: "a name in data is believed without proof"; and
//! "ownership is acquired, not only given at creation"): a type that a
//! trigger merely *names* is granted only when its CRD exists, is
//! *controlled* (`controller: true`, by uid) by the trigger or a family
//! member, and was created no earlier than that revision's Provider (or
//! the XRD). Crossplane writes the other ownerReferences for whoever
//! writes a package or an XRD: an inactive revision adds non-controller
//! references to any object its package names; an active revision, an MRD
//! (server-side applied with force) and an XRD take over an existing CRD
//! no one controls. Such a CRD stays older than the Provider or XRD. And
//! the controller's own API group is never granted from data.

use std::collections::BTreeSet;

use rbac_rules::api::OutputKind;
use rbac_rules::engine::{Engine, ErrorKind, Evaluation, Options};
use serde_json::{Value, json};

mod support;
use support::engine::{CRD_CREATED, OWNER_CREATED, builtin, crd, granted, rules, rules_of, store};

/// When the foreign tool (Kyverno, Argo CD, ... installed by Helm) made its
/// CRDs: before Crossplane's Providers and XRDs.
const FOREIGN_CREATED: &str = "2025-06-01T00:00:00Z";

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

/// The uid of the Provider that controls revision `name`.
fn provider_uid(name: &str) -> String {
    format!("uid-prov-{name}")
}

/// An ownerReference, as Kubernetes stores it.
fn owner_ref(kind: &str, uid: &str, controller: bool) -> Value {
    json!({"apiVersion": "pkg.crossplane.io/v1", "kind": kind, "name": uid, "uid": uid,
           "controller": controller, "blockOwnerDeletion": true})
}

/// A ProviderRevision of family `provider-family-x` (image org `org`),
/// naming `refs` in its objectRefs, controlled by its Provider (see
/// [`with_providers`]).
fn revision(name: &str, org: &str, refs: &[String], paused: bool) -> Value {
    let refs: Vec<Value> = refs
        .iter()
        .map(|n| json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition", "name": n}))
        .collect();
    let mut v = json!({"apiVersion": "pkg.crossplane.io/v1", "kind": "ProviderRevision",
        "metadata": {"name": name, "uid": format!("uid-{name}"),
                     "creationTimestamp": support::engine::REVISION_CREATED,
                     "ownerReferences": [owner_ref("Provider", &provider_uid(name), true)],
                     "labels": {"pkg.crossplane.io/provider-family": "provider-family-x"}},
        "spec": {"image": format!("xpkg.example.org/{org}/{name}:v1")},
        "status": {"objectRefs": refs}});
    if paused {
        v["metadata"]["annotations"] = json!({"crossplane.io/paused": "true"});
    }
    v
}

/// A Provider with uid `uid`, created at `created`.
fn provider(uid: &str, created: &str) -> Value {
    json!({"apiVersion": "pkg.crossplane.io/v1", "kind": "Provider",
        "metadata": {"name": uid, "uid": uid, "creationTimestamp": created}})
}

/// `objects` with, for each revision whose controlling Provider is not
/// among them, that Provider (created before the revision), as Crossplane
/// makes them.
fn with_providers(objects: &[Value]) -> Vec<Value> {
    let uids: BTreeSet<&str> = objects
        .iter()
        .filter_map(|o| o["metadata"]["uid"].as_str())
        .collect();
    let mut out = objects.to_vec();
    let mut added = BTreeSet::new();
    for o in objects.iter().filter(|o| o["kind"] == "ProviderRevision") {
        for r in o["metadata"]["ownerReferences"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let uid = r["uid"].as_str().unwrap_or_default();
            if r["kind"] == "Provider" && !uids.contains(uid) && added.insert(uid.to_string()) {
                out.push(provider(uid, OWNER_CREATED));
            }
        }
    }
    out
}

fn xrd(name: &str, uid: &str, group: &str, plural: &str) -> Value {
    json!({"apiVersion": "apiextensions.crossplane.io/v1", "kind": "CompositeResourceDefinition",
        "metadata": {"name": name, "uid": uid, "creationTimestamp": OWNER_CREATED},
        "spec": {"group": group, "names": {"kind": "X", "plural": plural}}})
}

/// A CRD nobody owns (installed by an admin or by Helm, as the
/// controller's own and other tools' are), made before Crossplane's
/// objects.
fn unowned_crd(name: &str) -> Value {
    let (plural, group) = name.split_once('.').unwrap_or((name, ""));
    json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": name, "uid": format!("crd-{name}"), "creationTimestamp": FOREIGN_CREATED},
        "spec": {"group": group, "names": {"plural": plural}}})
}

/// The built-in rules over `objects` and their revisions' Providers.
fn evaluate(objects: &[Value]) -> Evaluation {
    Engine::new(&builtin(), Options::default()).evaluate(&store(&with_providers(objects)))
}

#[test]
fn a_revision_gets_only_the_types_whose_crds_it_controls() {
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
fn a_non_controller_owner_reference_proves_nothing() {
    // Crossplane's package manager makes an inactive revision a
    // non-controller owner of every existing object its package names:
    // once believed (behaviour changed on purpose), never again.
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
    assert!(groups(&eval).is_empty(), "{:?}", groups(&eval));
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

/// A CRD with these ownerReferences, created at `created`.
fn crd_with(name: &str, created: &str, refs: Vec<Value>) -> Value {
    let mut c = unowned_crd(name);
    c["metadata"]["creationTimestamp"] = json!(created);
    c["metadata"]["ownerReferences"] = Value::Array(refs);
    c
}

/// A foreign tool's type, as Helm installs it: no ownerReferences, made
/// before Crossplane's objects.
const FOREIGN: &str = "clusterpolicies.kyverno.io";

#[test]
fn package_author_an_inactive_revision_adds_references_to_a_foreign_crd() {
    // The package names Kyverno's CRD; its revision is inactive (manual
    // activation): the package manager adds the revision and the Provider
    // as non-controller owners of the existing CRD.
    let objects = [
        revision("provider-evil", "mallory", &[FOREIGN.to_string()], false),
        crd_with(
            FOREIGN,
            FOREIGN_CREATED,
            vec![
                owner_ref("ProviderRevision", "uid-provider-evil", false),
                owner_ref("Provider", &provider_uid("provider-evil"), false),
            ],
        ),
    ];
    let eval = evaluate(&objects);
    assert!(!groups(&eval).contains("kyverno.io"), "{:?}", groups(&eval));
}

#[test]
fn package_author_an_active_revision_or_mrd_takes_over_a_foreign_crd() {
    // An active revision (AddControllerReference on a CRD no one
    // controls) or a ManagedResourceDefinition's CRD, server-side applied
    // with force: the foreign CRD now names the revision as controller
    // (and the MRD or the Provider beside it), but it is older than the
    // revision's Provider.
    for (what, second) in [
        (
            "revision",
            owner_ref("Provider", &provider_uid("provider-evil"), false),
        ),
        (
            "mrd",
            json!({"apiVersion": "apiextensions.crossplane.io/v1alpha1",
                   "kind": "ManagedResourceDefinition", "name": FOREIGN, "uid": "uid-mrd"}),
        ),
    ] {
        let objects = [
            revision("provider-evil", "mallory", &[FOREIGN.to_string()], false),
            crd_with(
                FOREIGN,
                FOREIGN_CREATED,
                vec![
                    second,
                    owner_ref("ProviderRevision", "uid-provider-evil", true),
                ],
            ),
        ];
        let eval = evaluate(&objects);
        assert!(
            !groups(&eval).contains("kyverno.io"),
            "{what}: {:?}",
            groups(&eval)
        );
    }
}

#[test]
fn xrd_author_an_xrd_named_like_a_foreign_crd_takes_it_over_for_nothing() {
    // MustBeControllableBy passes on a CRD with no controller: the XRD
    // controller applies its CRD over Kyverno's and becomes its
    // controller; the CRD stays older than the XRD.
    let (plural, group) = FOREIGN.split_once('.').unwrap_or_default();
    let objects = [
        xrd(FOREIGN, "uid-xrd-evil", group, plural),
        crd_with(
            FOREIGN,
            FOREIGN_CREATED,
            vec![json!({"apiVersion": "apiextensions.crossplane.io/v1",
                        "kind": "CompositeResourceDefinition", "name": FOREIGN,
                        "uid": "uid-xrd-evil", "controller": true})],
        ),
    ];
    let eval = evaluate(&objects);
    assert!(groups(&eval).is_empty(), "{:?}", groups(&eval));
    // The same CRD made by the XRD (no older than it) is its type.
    let mut made = objects.to_vec();
    made[1]["metadata"]["creationTimestamp"] = json!(CRD_CREATED);
    assert!(groups(&evaluate(&made)).contains(group));
}

#[test]
fn a_provider_upgrade_keeps_its_types() {
    // Revision 1 made the CRD; revision 2, made a day later, is now its
    // controller (revision 1's reference flipped to non-controller). The
    // CRD is older than revision 2 but not than their Provider.
    let mut rev1 = revision("provider-aws-1", "org", &[], false);
    let mut rev2 = revision("provider-aws-2", "org", &[], false);
    rev1["metadata"]["labels"] = json!({});
    rev2["metadata"]["labels"] = json!({});
    let prov = provider_uid("provider-aws");
    for r in [&mut rev1, &mut rev2] {
        r["metadata"]["ownerReferences"] = json!([owner_ref("Provider", &prov, true)]);
    }
    rev2["metadata"]["creationTimestamp"] = json!("2026-01-02T00:00:00Z");
    let objects = [
        provider(&prov, OWNER_CREATED),
        rev1,
        rev2,
        crd_with(
            "buckets.s3.example.org",
            CRD_CREATED,
            vec![
                owner_ref("ProviderRevision", "uid-provider-aws-1", false),
                owner_ref("Provider", &prov, false),
                owner_ref("ProviderRevision", "uid-provider-aws-2", true),
            ],
        ),
    ];
    let eval = evaluate(&objects);
    let edit = rules_of(
        &eval,
        OutputKind::ClusterRole,
        "crossplane:provider:provider-aws-2:aggregate-to-edit",
    );
    assert_eq!(edit[0]["apiGroups"], json!(["s3.example.org"]), "{edit}");
    // The inactive revision 1 is only a non-controller owner: nothing.
    let old = rules_of(
        &eval,
        OutputKind::ClusterRole,
        "crossplane:provider:provider-aws-1:aggregate-to-edit",
    );
    assert_eq!(old, Value::Null, "{old}");
    // Had the Provider been made after the CRD, the CRD was taken over.
    let mut late = objects.to_vec();
    late[0]["metadata"]["creationTimestamp"] = json!("2026-01-01T00:02:00Z");
    assert!(groups(&evaluate(&late)).is_empty());
}

#[test]
fn a_family_member_lends_what_it_made_and_not_what_it_took_over() {
    let objects = [
        revision("provider-ec2", "org", &[], false),
        revision("provider-family", "org", &[], false),
        crd(
            "providerconfigs.family.example.org",
            "ProviderRevision",
            "uid-provider-family",
            true,
        ),
        // Taken over by the family member: older than its Provider.
        crd_with(
            FOREIGN,
            FOREIGN_CREATED,
            vec![owner_ref("ProviderRevision", "uid-provider-family", true)],
        ),
    ];
    let eval = evaluate(&objects);
    let system = rules_of(
        &eval,
        OutputKind::ClusterRole,
        "crossplane:provider:provider-ec2:system",
    )
    .to_string();
    assert!(system.contains("family.example.org"), "{system}");
    assert!(!groups(&eval).contains("kyverno.io"), "{:?}", groups(&eval));
}

#[test]
fn a_crd_made_from_an_mrd_of_the_revision_is_its_type() {
    // Crossplane v2: the CRD made from a ManagedResourceDefinition carries
    // the MRD (not as controller) and the MRD's controller, the revision.
    let objects = [
        revision("provider-s3", "org", &[], false),
        crd_with(
            "accesspoints.s3.example.org",
            CRD_CREATED,
            vec![
                json!({"apiVersion": "apiextensions.crossplane.io/v1alpha1",
                       "kind": "ManagedResourceDefinition", "name": "accesspoints.s3.example.org",
                       "uid": "uid-mrd"}),
                owner_ref("ProviderRevision", "uid-provider-s3", true),
            ],
        ),
    ];
    assert!(groups(&evaluate(&objects)).contains("s3.example.org"));
}

/// A rule that believes a CRD controlled by an MRD the trigger controls:
/// the walk up controller references goes CRD -> MRD -> revision ->
/// Provider.
const MRD_RULE: &str = r#"
apiVersion: rbacrules.io/v1alpha1
kind: RbacRule
metadata: {name: mrd-lineage}
spec:
  trigger: {apiGroup: pkg.crossplane.io, kind: ProviderRevision}
  related:
  - name: providers
    objects: {apiGroup: pkg.crossplane.io, kind: Provider, metadataOnly: true}
  - name: mrds
    objects:
      apiGroup: apiextensions.crossplane.io
      kind: ManagedResourceDefinition
      metadataOnly: true
      controlledBy: [trigger]
  - name: crds
    objects:
      apiGroup: apiextensions.k8s.io
      kind: CustomResourceDefinition
      metadataOnly: true
      controlledBy: [trigger, mrds]
      notOlderThan: providers
  outputs:
  - kind: ClusterRole
    forEach: related.crds
    as: c
    name: "mrd:{{trigger.metadata.name}}:{{c.metadata.name}}"
    rules:
    - apiGroups: ["example.org"]
      resources: [things]
      verbs: [get]
"#;

#[test]
fn a_crd_controlled_by_an_mrd_the_trigger_controls_is_believed_when_made_after_the_provider() {
    let mrd = |uid: &str, controller_uid: &str| {
        json!({"apiVersion": "apiextensions.crossplane.io/v1alpha1", "kind": "ManagedResourceDefinition",
               "metadata": {"name": uid, "uid": uid, "creationTimestamp": CRD_CREATED,
                            "ownerReferences": [owner_ref("ProviderRevision", controller_uid, true)]}})
    };
    let mrd_ref = |uid: &str| {
        json!({"apiVersion": "apiextensions.crossplane.io/v1alpha1", "kind": "ManagedResourceDefinition",
               "name": uid, "uid": uid, "controller": true})
    };
    let objects = [
        revision("provider-s3", "org", &[], false),
        mrd("uid-mrd-mine", "uid-provider-s3"),
        mrd("uid-mrd-other", "uid-someone-else"),
        crd_with(
            "mine.s3.example.org",
            CRD_CREATED,
            vec![mrd_ref("uid-mrd-mine")],
        ),
        // Taken over by my MRD: older than my Provider.
        crd_with(FOREIGN, FOREIGN_CREATED, vec![mrd_ref("uid-mrd-mine")]),
        // Another revision's MRD's.
        crd_with(
            "theirs.s3.example.org",
            CRD_CREATED,
            vec![mrd_ref("uid-mrd-other")],
        ),
    ];
    let engine = Engine::new(&rules(MRD_RULE), Options::default());
    let eval = engine.evaluate(&store(&with_providers(&objects)));
    let names: BTreeSet<&str> = eval.desired.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(
        names,
        BTreeSet::from(["mrd:provider-s3:mine.s3.example.org"]),
        "{:?}",
        eval.errors().collect::<Vec<_>>()
    );
    // The reference (the specification) agrees.
    let reference = rbac_rules::reference::evaluate(
        &rules(MRD_RULE),
        &Options::default(),
        &store(&with_providers(&objects)),
    );
    assert_eq!(reference.desired, eval.desired);
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
        /// family member controls.
        #[test]
        fn granted_types_are_exactly_the_controlled_ones(
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
                // Only a controller reference proves anything.
                if o < 2 && c {
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

    /// What one actor has Crossplane write to a foreign CRD.
    #[derive(Clone, Copy, Debug)]
    enum Write {
        /// The attacker's revision is inactive: non-controller references
        /// to it and its Provider (establisher `update`, `!control`).
        Inactive,
        /// The attacker's revision is active: it becomes the controller
        /// when there is none (AddControllerReference), its Provider an
        /// owner.
        ActiveTakeover,
        /// An MRD of the attacker's package: server-side applied with
        /// force, the MRD an owner and the revision the controller (the
        /// API server refuses a second controller).
        MrdForce,
        /// An XRD named like the CRD: its controller when there is none
        /// (MustBeControllableBy passes).
        XrdTakeover,
    }

    fn write_strategy() -> impl Strategy<Value = Write> {
        prop_oneof![
            Just(Write::Inactive),
            Just(Write::ActiveTakeover),
            Just(Write::MrdForce),
            Just(Write::XrdTakeover),
        ]
    }

    fn has_controller(refs: &[Value]) -> Option<String> {
        refs.iter()
            .find(|r| r["controller"] == json!(true))
            .map(|r| r["uid"].as_str().unwrap_or_default().to_string())
    }

    /// Adds (or, as a server-side apply does, updates) the reference by uid.
    fn put_ref(refs: &mut Vec<Value>, r: Value) {
        match refs.iter_mut().find(|x| x["uid"] == r["uid"]) {
            Some(x) => *x = r,
            None => refs.push(r),
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]

        /// Whatever package authors and XRD authors have Crossplane write
        /// to CRDs another tool installed before them (in any order, as
        /// the attacker's family member or not, with the attacker's
        /// Provider and XRDs created at any time after), no output grants
        /// a foreign type; the legitimate provider keeps its own.
        #[test]
        fn a_foreign_crd_is_never_granted_whatever_crossplane_writes_on_it(
            writes in proptest::collection::vec(proptest::collection::vec(write_strategy(), 0..4), 3),
            foreign_age in proptest::collection::vec(0..300u32, 3),
            evil_provider_age in 0..86_400u32,
            xrd_age in 0..86_400u32,
            same_family in any::<bool>(),
            evil_paused in any::<bool>(),
        ) {
            let at = |secs: u32| {
                let base = rbac_rules::engine::time::parse_rfc3339(OWNER_CREATED).unwrap_or_default();
                let t = base + i64::from(secs);
                let (d, s) = (t.div_euclid(86_400), t.rem_euclid(86_400));
                // Days since 2026-01-01 (the base), within January.
                let day = d - base.div_euclid(86_400) + 1;
                format!("2026-01-{day:02}T{:02}:{:02}:{:02}Z", s / 3600, s / 60 % 60, s % 60)
            };
            let org = if same_family { "org" } else { "mallory" };
            let foreign: Vec<String> = (0..3).map(|k| format!("f{k}s.f{k}.othertool.example.com")).collect();
            let evil_prov = provider_uid("provider-evil");
            let mut objects = vec![
                revision("provider-a", "org", &[], false),
                revision("provider-evil", org, &foreign, evil_paused),
                provider(&evil_prov, &at(evil_provider_age)),
                crd_with(
                    "widgets.good.example.org",
                    CRD_CREATED,
                    vec![
                        owner_ref("ProviderRevision", "uid-provider-a", true),
                        owner_ref("Provider", &provider_uid("provider-a"), false),
                    ],
                ),
            ];
            for (k, name) in foreign.iter().enumerate() {
                let (plural, group) = name.split_once('.').unwrap_or_default();
                let xrd_uid = format!("uid-xrd-{k}");
                let mut x = xrd(name, &xrd_uid, group, plural);
                x["metadata"]["creationTimestamp"] = json!(at(xrd_age));
                objects.push(x);
                let mut refs: Vec<Value> = Vec::new();
                for w in &writes[k] {
                    match w {
                        Write::Inactive => {
                            put_ref(&mut refs, owner_ref("ProviderRevision", "uid-provider-evil", false));
                            put_ref(&mut refs, owner_ref("Provider", &evil_prov, false));
                        }
                        Write::ActiveTakeover => {
                            if has_controller(&refs).is_none() {
                                put_ref(&mut refs, owner_ref("ProviderRevision", "uid-provider-evil", true));
                                put_ref(&mut refs, owner_ref("Provider", &evil_prov, false));
                            }
                        }
                        Write::MrdForce => {
                            if has_controller(&refs).is_none_or(|c| c == "uid-provider-evil") {
                                put_ref(&mut refs, json!({"apiVersion": "apiextensions.crossplane.io/v1alpha1",
                                    "kind": "ManagedResourceDefinition", "name": name, "uid": format!("uid-mrd-{k}")}));
                                put_ref(&mut refs, owner_ref("ProviderRevision", "uid-provider-evil", true));
                            }
                        }
                        Write::XrdTakeover => {
                            if has_controller(&refs).is_none() {
                                put_ref(&mut refs, json!({"apiVersion": "apiextensions.crossplane.io/v1",
                                    "kind": "CompositeResourceDefinition", "name": name,
                                    "uid": xrd_uid, "controller": true}));
                            }
                        }
                    }
                }
                // Installed by Helm before Crossplane's Providers and XRDs.
                let mut c = crd_with(name, FOREIGN_CREATED, refs);
                c["metadata"]["creationTimestamp"] = json!(format!("2025-06-01T00:{:02}:{:02}Z", foreign_age[k] / 60, foreign_age[k] % 60));
                objects.push(c);
            }
            let eval = evaluate(&objects);
            let all = granted_all(&eval);
            let leaked: Vec<_> = all.iter().filter(|(g, _)| g.ends_with("othertool.example.com")).collect();
            prop_assert!(leaked.is_empty(), "{:?}", leaked);
            prop_assert!(all.iter().any(|(g, _)| g == "good.example.org"), "{:?}", all);
        }
    }
}
