//! Helpers shared by the engine-level test suites: rules from YAML text,
//! the built-in rules, and a store of objects.

use rbac_rules::api::OutputKind;
use rbac_rules::engine::{Evaluation, ObjectStore, RuleSource};
use serde_json::{Value, json};

/// Rules parsed from `yaml` (named `test.yaml` in messages).
pub fn rules(yaml: &str) -> Vec<RuleSource> {
    rbac_rules::rules::parse_text(std::path::Path::new("test.yaml"), yaml).expect("rules parse")
}

/// The built-in rules (rules/*.yaml).
pub fn builtin() -> Vec<RuleSource> {
    rbac_rules::rules::builtin().expect("built-in rules load")
}

/// A store holding `objects`.
pub fn store(objects: &[Value]) -> ObjectStore {
    let mut s = ObjectStore::new();
    for o in objects {
        s.insert(o.clone()).expect("object inserts");
    }
    s
}

/// The `rules` of the desired `kind` object `name`, as JSON; null if there
/// is none.
pub fn rules_of(eval: &Evaluation, kind: OutputKind, name: &str) -> Value {
    eval.desired
        .iter()
        .find(|d| d.kind == kind && d.name == name)
        .map(|d| d.object.to_value()["rules"].clone())
        .unwrap_or(Value::Null)
}

/// When the fixtures' Providers and XRDs were created: before their
/// revisions ([`REVISION_CREATED`]) and CRDs ([`CRD_CREATED`]), as
/// Crossplane makes them.
pub const OWNER_CREATED: &str = "2026-01-01T00:00:00Z";
/// When the fixtures' ProviderRevisions were created.
pub const REVISION_CREATED: &str = "2026-01-01T00:00:10Z";
/// When the fixtures' CRDs were created (by their revision or XRD).
pub const CRD_CREATED: &str = "2026-01-01T00:01:00Z";

/// A CompositeResourceDefinition `xthings<i>.example.org`, with a claim
/// (XRD 3's claim plural is the hostile `*`) and paused as asked.
pub fn xrd(i: usize, claim: bool, paused: bool) -> Value {
    let mut v = json!({"apiVersion": "apiextensions.crossplane.io/v1", "kind": "CompositeResourceDefinition",
        "metadata": {"name": format!("xthings{i}.example.org"), "uid": format!("xrd-{i}"),
                     "creationTimestamp": OWNER_CREATED},
        "spec": {"group": "example.org", "names": {"kind": format!("XThing{i}"), "plural": format!("xthings{i}")}}});
    if claim {
        // XRD 3's claim is hostile: its warning comes and goes with it.
        let plural = if i == 3 {
            "*".to_string()
        } else {
            format!("things{i}")
        };
        v["spec"]["claimNames"] = json!({"kind": format!("Thing{i}"), "plural": plural});
    }
    if paused {
        v["metadata"]["annotations"] = json!({"crossplane.io/paused": "true"});
    }
    v
}

/// A ProviderRevision `provider-<p>` of `family-<family>`, image org
/// `org`, with `types` CRDs in its objectRefs (with 3, two hostile
/// entries too).
pub fn revision(p: usize, family: usize, org: &str, types: usize) -> Value {
    let mut refs: Vec<Value> = (0..types)
        .map(|t| {
            json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
                         "name": format!("kind{t}s.p{p}.example.org")})
        })
        .collect();
    // Three types come with hostile entries: skipped with warnings, which
    // incremental evaluation must report like a full one.
    if types == 3 {
        for bad in ["*.*", "secrets."] {
            refs.push(json!({"apiVersion": "apiextensions.k8s.io/v1",
                             "kind": "CustomResourceDefinition", "name": bad}));
        }
    }
    json!({"apiVersion": "pkg.crossplane.io/v1", "kind": "ProviderRevision",
        "metadata": {"name": format!("provider-{p}"), "uid": format!("pr-{p}"),
                     "creationTimestamp": REVISION_CREATED,
                     "ownerReferences": [provider_ref(p, true)],
                     "labels": {"pkg.crossplane.io/provider-family": format!("family-{family}")}},
        "spec": {"image": format!("registry.example.org/{org}/provider-{p}:v1")},
        "status": {"objectRefs": refs}})
}

/// The Provider `provider-<p>` (uid `prov-<p>`) whose revision is
/// [`revision`] `p`: a revision's CRDs are believed only when no older
/// than it.
pub fn provider(p: usize) -> Value {
    json!({"apiVersion": "pkg.crossplane.io/v1", "kind": "Provider",
        "metadata": {"name": format!("provider-{p}"), "uid": format!("prov-{p}"),
                     "creationTimestamp": OWNER_CREATED},
        "spec": {"package": format!("registry.example.org/org/provider-{p}:v1")}})
}

/// An ownerReference to Provider `p`, as its revision (controller) and
/// the revision's objects (not controller) carry.
pub fn provider_ref(p: usize, controller: bool) -> Value {
    json!({"apiVersion": "pkg.crossplane.io/v1", "kind": "Provider", "name": format!("provider-{p}"),
           "uid": format!("prov-{p}"), "controller": controller, "blockOwnerDeletion": true})
}

/// Every (group, resource) an object's rules grant.
pub fn granted(
    obj: impl std::borrow::Borrow<Value>,
) -> std::collections::BTreeSet<(String, String)> {
    let obj = obj.borrow();
    let mut out = std::collections::BTreeSet::new();
    for r in obj["rules"].as_array().into_iter().flatten() {
        for g in r["apiGroups"].as_array().into_iter().flatten() {
            for res in r["resources"].as_array().into_iter().flatten() {
                out.insert((
                    g.as_str().unwrap_or_default().to_string(),
                    res.as_str().unwrap_or_default().to_string(),
                ));
            }
        }
    }
    out
}

/// A CustomResourceDefinition `<plural>.<group>` with an ownerReference
/// (uid `owner_uid`, a controller one when `controller`), as Crossplane's
/// package manager and XRD controller make them.
pub fn crd(name: &str, owner_kind: &str, owner_uid: &str, controller: bool) -> Value {
    let (plural, group) = name.split_once('.').unwrap_or((name, ""));
    json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": name, "uid": format!("crd-{name}"), "creationTimestamp": CRD_CREATED,
                     "ownerReferences": [{"apiVersion": "example.org/v1", "kind": owner_kind,
                                          "name": owner_uid, "uid": owner_uid, "controller": controller}]},
        "spec": {"group": group, "names": {"plural": plural}}})
}

/// The CRDs of XRD `i` (see [`xrd`]): its type's and, with `claim`, its
/// claim's, controlled by it.
pub fn xrd_crds(i: usize, claim: bool) -> Vec<Value> {
    let uid = format!("xrd-{i}");
    let mut out = vec![crd(
        &format!("xthings{i}.example.org"),
        "CompositeResourceDefinition",
        &uid,
        true,
    )];
    if claim {
        out.push(crd(
            &format!("things{i}.example.org"),
            "CompositeResourceDefinition",
            &uid,
            true,
        ));
    }
    out
}

/// The CRDs revision `p` (see [`revision`]) controls: its `types`, and
/// with 3 one in a Kubernetes group too (skipped with a warning); each
/// also owned (not as controller) by the revision's Provider, as
/// Crossplane's package manager makes them.
pub fn revision_crds(p: usize, types: usize) -> Vec<Value> {
    let uid = format!("pr-{p}");
    let mut out: Vec<Value> = (0..types)
        .map(|t| {
            crd(
                &format!("kind{t}s.p{p}.example.org"),
                "ProviderRevision",
                &uid,
                true,
            )
        })
        .collect();
    if types == 3 {
        out.push(crd(
            &format!("nodes.p{p}.k8s.io"),
            "ProviderRevision",
            &uid,
            true,
        ));
    }
    for c in &mut out {
        if let Some(refs) = c["metadata"]["ownerReferences"].as_array_mut() {
            refs.push(provider_ref(p, false));
        }
    }
    out
}

/// The Deployment of revision `p` in crossplane-system, running as `sa`.
pub fn deployment(p: usize, sa: &str) -> Value {
    json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": format!("provider-{p}"), "namespace": "crossplane-system",
                     "ownerReferences": [{"apiVersion": "pkg.crossplane.io/v1", "kind": "ProviderRevision",
                                          "name": format!("provider-{p}"), "uid": format!("pr-{p}"), "controller": true}]},
        "spec": {"template": {"spec": {"serviceAccountName": sa}}}})
}

/// Namespace `team-<n>` accepting the claims of the XRDs `accepted`.
pub fn namespace(n: usize, accepted: &[usize]) -> Value {
    let ann: serde_json::Map<String, Value> = accepted
        .iter()
        .map(|i| {
            (
                format!("rbac.crossplane.io/xthings{i}.example.org"),
                json!("xrd-claim-accepted"),
            )
        })
        .collect();
    json!({"apiVersion": "v1", "kind": "Namespace",
           "metadata": {"name": format!("team-{n}"), "uid": format!("ns-{n}"), "annotations": ann}})
}

/// The shipped allow-list (deploy/controller/allow-list.yaml).
pub fn shipped_allow_list() -> rbac_rules::engine::AllowList {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/controller/allow-list.yaml");
    let text = std::fs::read_to_string(path).expect("allow-list reads");
    let docs: Vec<Value> = serde_saphyr::from_multiple(&text).expect("allow-list parses");
    let role: k8s_openapi::api::rbac::v1::ClusterRole =
        serde_json::from_value(docs[0].clone()).expect("a ClusterRole");
    rbac_rules::engine::AllowList::from_cluster_role(&role)
}
