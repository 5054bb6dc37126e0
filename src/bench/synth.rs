//! A deterministic generator of synthetic Crossplane control planes: the
//! objects the built-in rules (`rules/`) read, at three sizes.
//!
//! No randomness: object `i` of a scenario is always the same object, so
//! two runs (or two processes of one run) see byte-identical input.
//!
//! - ProviderRevisions (`pkg.crossplane.io/v1`) in families (label
//!   `pkg.crossplane.io/provider-family`, one image org per family), whose
//!   `status.objectRefs` list the scenario's CRDs, spread evenly;
//! - one provider Deployment per revision in `crossplane-system`, controlled
//!   by its revision (ownerReference with `controller: true`);
//! - CompositeResourceDefinitions, every even-numbered one with claimNames;
//! - Namespaces, each accepting claims of some claim-bearing XRDs
//!   (annotation `rbac.crossplane.io/<xrd-name>: xrd-claim-accepted`).

use serde_json::{Value, json};

/// The namespace of Crossplane and its provider Deployments.
pub const CROSSPLANE_NAMESPACE: &str = "crossplane-system";

/// A named size of control plane.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Scenario {
    /// CI-cheap: 7 revisions, 100 CRDs, 50 XRDs, 100 namespaces.
    Small,
    /// 70 revisions, 1,000 CRDs, 500 XRDs, 2,000 namespaces (2,640 objects in).
    Large,
    /// 70 revisions, 1,000 CRDs, 5,000 XRDs, 20,000 namespaces (25,140 in).
    Xl,
}

impl Scenario {
    /// Its sizes.
    pub fn sizes(self) -> Sizes {
        match self {
            Scenario::Small => Sizes {
                revisions: 7,
                family_size: 7,
                crds: 100,
                xrds: 50,
                namespaces: 100,
                accepted_per_namespace: 10,
            },
            Scenario::Large => Sizes {
                revisions: 70,
                family_size: 7,
                crds: 1_000,
                xrds: 500,
                namespaces: 2_000,
                accepted_per_namespace: 10,
            },
            Scenario::Xl => Sizes {
                revisions: 70,
                family_size: 7,
                crds: 1_000,
                xrds: 5_000,
                namespaces: 20_000,
                accepted_per_namespace: 10,
            },
        }
    }

    /// Its name, as `--scenario` spells it.
    pub fn name(self) -> &'static str {
        match self {
            Scenario::Small => "small",
            Scenario::Large => "large",
            Scenario::Xl => "xl",
        }
    }
}

/// The sizes of a synthetic control plane.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Sizes {
    /// ProviderRevisions (and as many provider Deployments).
    pub revisions: usize,
    /// Revisions per provider family.
    pub family_size: usize,
    /// CRDs named in all revisions' `status.objectRefs` together.
    pub crds: usize,
    /// CompositeResourceDefinitions; half (the even-numbered) have claimNames.
    pub xrds: usize,
    /// Namespaces.
    pub namespaces: usize,
    /// Claim-bearing XRDs each namespace accepts claims of.
    pub accepted_per_namespace: usize,
}

impl Sizes {
    /// Objects in: revisions, Deployments, XRDs and Namespaces.
    pub fn objects_in(&self) -> usize {
        2 * self.revisions + self.xrds + self.namespaces
    }

    /// XRDs with claimNames (the even-numbered ones).
    pub fn claim_xrds(&self) -> usize {
        self.xrds.div_ceil(2)
    }

    /// The most outputs one change of a revision's objectRefs may touch:
    /// a revision's three ClusterRoles (edit, system, view) list the types
    /// of its whole family (`of: [trigger, family]` in
    /// rules/crossplane-provider.yaml), so every member's three change.
    pub fn max_touched_per_revision_change(&self) -> usize {
        3 * self.family_size
    }
}

/// A deterministic resourceVersion source, as a live cluster numbers its
/// writes.
#[derive(Clone, Debug)]
pub struct Versions(u64);

impl Default for Versions {
    fn default() -> Self {
        Versions(1)
    }
}

impl Versions {
    /// The next resourceVersion.
    pub fn bump(&mut self) -> String {
        self.0 += 1;
        self.0.to_string()
    }
}

/// Family of revision `p`.
fn family(sizes: &Sizes, p: usize) -> usize {
    p / sizes.family_size.max(1)
}

/// metadata.name of revision `p`.
pub fn revision_name(p: usize) -> String {
    format!("provider-p{p}-1a2b3c")
}

/// The API group of revision `p`'s types.
fn revision_group(sizes: &Sizes, p: usize) -> String {
    format!("p{p}.family{}.example.org", family(sizes, p))
}

/// An objectRef of a CRD.
fn crd_ref(name: &str) -> Value {
    json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition", "name": name})
}

/// The CRDs revision `p` lists: `crds` spread evenly, the first revisions
/// taking one more when they do not divide.
fn revision_refs(sizes: &Sizes, p: usize) -> Vec<Value> {
    let r = sizes.revisions.max(1);
    let count = sizes.crds / r + usize::from(p < sizes.crds % r);
    let group = revision_group(sizes, p);
    (0..count)
        .map(|t| crd_ref(&format!("kind{t}s.{group}")))
        .collect()
}

/// ProviderRevision `p` with the given objectRefs.
fn revision(sizes: &Sizes, p: usize, refs: Vec<Value>, rv: String) -> Value {
    let f = family(sizes, p);
    json!({
        "apiVersion": "pkg.crossplane.io/v1",
        "kind": "ProviderRevision",
        "metadata": {
            "name": revision_name(p),
            "uid": format!("00000000-0000-4000-8000-{p:012}"),
            "resourceVersion": rv,
            "labels": {"pkg.crossplane.io/provider-family": format!("family-{f}")},
        },
        "spec": {"image": format!("xpkg.example.org/org{f}/provider-p{p}:v1.0.0"), "desiredState": "Active"},
        "status": {"objectRefs": refs},
    })
}

/// The provider Deployment of revision `p`.
fn deployment(p: usize, rv: String) -> Value {
    json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": format!("provider-p{p}"),
            "namespace": CROSSPLANE_NAMESPACE,
            "uid": format!("00000000-0000-4000-9000-{p:012}"),
            "resourceVersion": rv,
            "ownerReferences": [{
                "apiVersion": "pkg.crossplane.io/v1", "kind": "ProviderRevision",
                "name": revision_name(p), "uid": format!("00000000-0000-4000-8000-{p:012}"),
                "controller": true, "blockOwnerDeletion": true,
            }],
        },
        "spec": {"template": {"spec": {"serviceAccountName": format!("provider-p{p}")}}},
    })
}

/// metadata.name of XRD `i` (`<plural>.<group>`).
pub fn xrd_name(i: usize) -> String {
    format!("xthing{i}s.platform.example.org")
}

/// XRD `i`, with claimNames when `claims`.
fn xrd_object(name_stem: &str, claims: bool, uid: String, rv: String) -> Value {
    let mut spec = json!({
        "group": "platform.example.org",
        "names": {"kind": format!("X{name_stem}"), "plural": format!("x{name_stem}s")},
        "versions": [{"name": "v1alpha1", "served": true, "referenceable": true}],
    });
    if claims {
        spec["claimNames"] = json!({"kind": name_stem, "plural": format!("{name_stem}s")});
    }
    json!({
        "apiVersion": "apiextensions.crossplane.io/v1",
        "kind": "CompositeResourceDefinition",
        "metadata": {"name": format!("x{name_stem}s.platform.example.org"), "uid": uid, "resourceVersion": rv},
        "spec": spec,
    })
}

/// metadata.name of namespace `n`.
pub fn namespace_name(n: usize) -> String {
    format!("team-{n:05}")
}

/// The claim-bearing XRDs namespace `n` accepts, shifted by `shift`: spread
/// over all of them, never twice the same.
fn accepted(sizes: &Sizes, n: usize, shift: usize) -> Vec<usize> {
    let c = sizes.claim_xrds();
    if c == 0 {
        return Vec::new();
    }
    let k = sizes.accepted_per_namespace.min(c);
    let step = (c / k.max(1)).max(1);
    (0..k).map(|j| 2 * ((n + shift + j * step) % c)).collect()
}

/// Namespace `n`, accepting the XRDs `accepted` names.
fn namespace(n: usize, xrds: &[usize], rv: String) -> Value {
    let annotations: serde_json::Map<String, Value> = xrds
        .iter()
        .map(|&i| {
            (
                format!("rbac.crossplane.io/{}", xrd_name(i)),
                json!("xrd-claim-accepted"),
            )
        })
        .collect();
    json!({
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {
            "name": namespace_name(n),
            "uid": format!("00000000-0000-4000-a000-{n:012}"),
            "resourceVersion": rv,
            "annotations": annotations,
        },
    })
}

/// Every object of a control plane of these sizes, in a fixed order:
/// revisions, Deployments, XRDs, Namespaces.
pub fn objects(sizes: &Sizes, versions: &mut Versions) -> Vec<Value> {
    let mut out = Vec::with_capacity(sizes.objects_in());
    for p in 0..sizes.revisions {
        out.push(revision(sizes, p, revision_refs(sizes, p), versions.bump()));
    }
    for p in 0..sizes.revisions {
        out.push(deployment(p, versions.bump()));
    }
    for i in 0..sizes.xrds {
        out.push(xrd_object(
            &format!("thing{i}"),
            i % 2 == 0,
            format!("00000000-0000-4000-b000-{i:012}"),
            versions.bump(),
        ));
    }
    for n in 0..sizes.namespaces {
        out.push(namespace(n, &accepted(sizes, n, 0), versions.bump()));
    }
    out
}

/// The kinds of change the incremental benchmark makes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChangeKind {
    /// A Namespace accepts claims of a different set of XRDs.
    NamespaceAnnotation,
    /// A new XRD (with claimNames) appears.
    XrdAdded,
    /// A ProviderRevision lists one more CRD in its objectRefs.
    RevisionObjectRefs,
}

impl ChangeKind {
    /// Every kind, in report order.
    pub const ALL: [ChangeKind; 3] = [
        ChangeKind::NamespaceAnnotation,
        ChangeKind::XrdAdded,
        ChangeKind::RevisionObjectRefs,
    ];

    /// Its key in the report.
    pub fn key(self) -> &'static str {
        match self {
            ChangeKind::NamespaceAnnotation => "namespace_annotation",
            ChangeKind::XrdAdded => "xrd_added",
            ChangeKind::RevisionObjectRefs => "revision_object_refs",
        }
    }
}

/// The `i`-th change of a kind: the object as it is after the change (a
/// new or replacing object). Changes of one kind apply in order `0, 1, …`:
/// namespaces are each changed once while `i` < namespaces (a stride prime
/// to common sizes); revision changes accumulate refs.
pub fn change(sizes: &Sizes, kind: ChangeKind, i: usize, versions: &mut Versions) -> Value {
    match kind {
        ChangeKind::NamespaceAnnotation => {
            let n = (i * 7919) % sizes.namespaces.max(1);
            namespace(
                n,
                &accepted(sizes, n, 1 + i / sizes.namespaces.max(1)),
                versions.bump(),
            )
        }
        ChangeKind::XrdAdded => xrd_object(
            &format!("added{i}"),
            true,
            format!("00000000-0000-4000-c000-{i:012}"),
            versions.bump(),
        ),
        ChangeKind::RevisionObjectRefs => {
            let r = sizes.revisions.max(1);
            let p = i % r;
            let mut refs = revision_refs(sizes, p);
            let group = revision_group(sizes, p);
            // Every earlier change of this revision, and this one.
            for k in (p..=i).step_by(r) {
                refs.push(crd_ref(&format!("added{k}s.{group}")));
            }
            revision(sizes, p, refs, versions.bump())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn large_has_the_issue_sizes() {
        let s = Scenario::Large.sizes();
        let objs = objects(&s, &mut Versions::default());
        assert_eq!(objs.len(), 2_640);
        assert_eq!(s.objects_in(), 2_640);
        assert_eq!(Scenario::Xl.sizes().objects_in(), 25_140);
        let refs: usize = objs
            .iter()
            .filter(|o| o["kind"] == "ProviderRevision")
            .map(|o| o["status"]["objectRefs"].as_array().map_or(0, Vec::len))
            .sum();
        assert_eq!(refs, 1_000);
        let claims = objs
            .iter()
            .filter(|o| {
                o["kind"] == "CompositeResourceDefinition" && o["spec"].get("claimNames").is_some()
            })
            .count();
        assert_eq!(claims, 250);
    }

    #[test]
    fn namespaces_accept_distinct_claim_xrds() {
        for sc in [Scenario::Small, Scenario::Large] {
            let s = sc.sizes();
            for n in [0, 1, s.namespaces - 1] {
                let mut a = accepted(&s, n, 0);
                assert_eq!(a.len(), 10);
                assert!(a.iter().all(|i| i % 2 == 0 && *i < s.xrds));
                a.sort();
                a.dedup();
                assert_eq!(a.len(), 10, "{sc:?} namespace {n}");
                assert_ne!(accepted(&s, n, 0), accepted(&s, n, 1));
            }
        }
    }

    #[test]
    fn generation_is_deterministic() {
        let s = Scenario::Small.sizes();
        let a = objects(&s, &mut Versions::default());
        let b = objects(&s, &mut Versions::default());
        assert_eq!(a, b);
        let c1 = change(
            &s,
            ChangeKind::RevisionObjectRefs,
            9,
            &mut Versions::default(),
        );
        let c2 = change(
            &s,
            ChangeKind::RevisionObjectRefs,
            9,
            &mut Versions::default(),
        );
        assert_eq!(c1, c2);
        // Revision 2's second change keeps its first added ref.
        assert_eq!(c1["metadata"]["name"], revision_name(2));
        let refs = c1["status"]["objectRefs"].as_array().map_or(0, Vec::len);
        assert_eq!(refs, revision_refs(&s, 2).len() + 2);
    }
}
